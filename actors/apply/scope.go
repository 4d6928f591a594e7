package apply

import (
	"fmt"
	"path"
	"strings"
)

// Scope is the set of (schema, table) patterns a node syncs (SSP/1 §12
// step 3). A pattern is "schema/table" where either part may use
// path.Match wildcards; "*/*" matches everything.
type Scope struct {
	patterns []string
}

// ParseScope validates patterns. An empty list means everything.
func ParseScope(patterns []string) (Scope, error) {
	if len(patterns) == 0 {
		return Scope{patterns: []string{"*/*"}}, nil
	}
	for _, p := range patterns {
		if strings.Count(p, "/") != 1 {
			return Scope{}, fmt.Errorf("apply: scope pattern %q: want schema/table", p)
		}
		if _, err := path.Match(p, "a/b"); err != nil {
			return Scope{}, fmt.Errorf("apply: scope pattern %q: %w", p, err)
		}
	}
	return Scope{patterns: append([]string(nil), patterns...)}, nil
}

// Contains reports whether (schema, table) is in scope. Names containing
// "/" never match, so a name cannot straddle the separator.
func (s Scope) Contains(schema, table string) bool {
	if strings.Contains(schema, "/") || strings.Contains(table, "/") {
		return false
	}
	name := schema + "/" + table
	for _, p := range s.patterns {
		if ok, _ := path.Match(p, name); ok {
			return true
		}
	}
	return false
}

// Patterns returns the scope's patterns.
func (s Scope) Patterns() []string { return append([]string(nil), s.patterns...) }
