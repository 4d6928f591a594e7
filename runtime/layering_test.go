package runtime

import (
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

const modulePath = "github.com/syncmesh/syncmesh"

// importsUnder returns, for every .go file under dir (skipping the
// directories skip names, relative to dir, and test files unless tests),
// the import paths that start with one of prefixes.
func importsUnder(t *testing.T, dir string, skip []string, tests bool, prefixes ...string) map[string][]string {
	t.Helper()
	found := map[string][]string{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		if d.IsDir() {
			for _, s := range skip {
				if rel == s {
					return filepath.SkipDir
				}
			}
			if d.Name() == "testdata" {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || (!tests && strings.HasSuffix(path, "_test.go")) {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			for _, pre := range prefixes {
				if p == pre || strings.HasPrefix(p, pre+"/") {
					found[rel] = append(found[rel], p)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return found
}

// Every sentinel a user may need is reachable from runtime (errors.go), so
// no example — tests included — imports syncmesh/actors/...; only
// examples/benchreport, which measures internals, does. runtime/hosting,
// user code of runtime too, does not either (its tests may use the actor
// test kit).
func TestExamplesDoNotImportActors(t *testing.T) {
	actors := modulePath + "/actors"
	for rel, imps := range importsUnder(t, filepath.Join("..", "examples"), []string{"benchreport"}, true, actors) {
		t.Errorf("examples/%s imports %v: use the runtime's re-exports", rel, imps)
	}
	for rel, imps := range importsUnder(t, "hosting", nil, false, actors) {
		t.Errorf("runtime/hosting/%s imports %v: use the runtime's re-exports", rel, imps)
	}
	// The walk really sees imports: benchreport does import actors.
	if len(importsUnder(t, filepath.Join("..", "examples", "benchreport"), nil, true, actors)) == 0 {
		t.Fatal("no actors import found in examples/benchreport: the walk is broken")
	}
}
