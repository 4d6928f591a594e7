// Package doccheck holds a test over the repository's text files: every
// documentation reference (a markdown link, a mention of a .md file)
// resolves to a file in the repository, everything under docs/ is linked
// from the README, and nothing points at files outside the repository
// (docs/README.md lists what the repository documents).
package doccheck
