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

// layerOf ranks a package of the module by its top-level directory: a
// package may import only packages of a lower rank or of its own
// directory (the README's layering line).
func layerOf(path string) (string, int) {
	rel := strings.TrimPrefix(strings.TrimPrefix(path, modulePath), "/")
	top, _, _ := strings.Cut(rel, "/")
	rank := map[string]int{"messages": 0, "crypto": 1, "persistence": 2, "actors": 3, "runtime": 4, "examples": 5}
	r, ok := rank[top]
	if !ok {
		return top, -1
	}
	return top, r
}

// The import graph is the one the README states: examples → runtime →
// actors → persistence → crypto → messages (each layer may skip the ones
// between), library code imports no test store, and runtime matches no
// bbolt error itself (persistence.ErrLocked carries the lock timeout).
func TestImportsPointDownward(t *testing.T) {
	for _, top := range []string{"messages", "crypto", "persistence", "actors", "runtime"} {
		for rel, imps := range importsUnder(t, filepath.Join("..", top), nil, false, modulePath, "go.etcd.io/bbolt") {
			from := top + "/" + filepath.ToSlash(filepath.Dir(rel))
			fromTop, fromRank := layerOf(modulePath + "/" + from)
			for _, imp := range imps {
				if strings.HasPrefix(imp, "go.etcd.io/bbolt") {
					if fromTop != "persistence" {
						t.Errorf("%s/%s imports %s: only persistence/bolt may", top, rel, imp)
					}
					continue
				}
				impTop, impRank := layerOf(imp)
				if strings.HasSuffix(imp, "/persistence/memory") || strings.HasSuffix(imp, "/persistence/storetest") {
					if fromTop == "actors" || fromTop == "crypto" || fromTop == "messages" || (fromTop == "persistence" && !strings.HasPrefix(from, "persistence/storetest")) {
						t.Errorf("%s/%s imports %s: library code above tests uses no test store", top, rel, imp)
					}
				}
				if impTop == fromTop {
					continue
				}
				if impRank > fromRank {
					t.Errorf("%s/%s imports %s: upward (%s above %s)", top, rel, imp, impTop, fromTop)
				}
			}
		}
	}
}
