package runtime

import (
	"bufio"
	"bytes"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// aliasedIntoActors are the exported names of runtime that are still
// type aliases of actors/* types (go doc shows no fields for them): a
// signature may name them, nothing else of actors/*. The list may only
// shrink: a name here that is no longer such an alias fails the test.
var aliasedIntoActors = map[string]bool{
	"ReceivedMessage": true, "ReceiveResult": true, "CommitResult": true, "PendingPage": true,
	"SentMessage": true, "SentPage": true, "RetentionPolicy": true, "RetryPolicy": true,
	"PruneSchedule": true, "IdleTimer": true, "IdleTick": true, "CellState": true,
}

// outcomeType is the type of the receive and commit outcomes (Delivery,
// Committed, …): ReceiveResult.Kind and CommitResult.Status, reached
// through those aliases; it goes when they become runtime types.
const outcomeType = modulePath + "/actors/inbound.Outcome"

// internalPath reports whether a package path is one an application must
// not depend on: the actor layer (actors/...) or a Go internal package.
func internalPath(path string) bool {
	return strings.HasPrefix(path, modulePath+"/actors/") || path == modulePath+"/actors" ||
		strings.Contains(path, "/internal/") || strings.HasSuffix(path, "/internal")
}

// runtimeAPI type-checks nothing itself: it reads the compiled export
// data of runtime (go list -export) and returns its package.
func runtimeAPI(t *testing.T) *types.Package {
	t.Helper()
	out, err := exec.Command("go", "list", "-export", "-deps", "-f", "{{.ImportPath}}\t{{.Export}}", ".").Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			t.Fatalf("go list -export: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("go list -export: %v", err)
	}
	exports := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		path, file, _ := strings.Cut(sc.Text(), "\t")
		exports[path] = file
	}
	imp := importer.ForCompiler(token.NewFileSet(), "gc", func(path string) (io.ReadCloser, error) {
		return os.Open(exports[path])
	})
	pkg, err := imp.Import(modulePath + "/runtime")
	if err != nil {
		t.Fatal(err)
	}
	return pkg
}

// apiMentions walks the exported API of pkg (exported names, the fields
// of exported struct types, the methods of exported types) and returns,
// for each place that reaches a type of an internal package (internalPath)
// other than through an allowed alias, one line naming it.
func apiMentions(pkg *types.Package, allowed map[string]bool) []string {
	var found []string
	seen := map[types.Type]bool{}
	allowedTargets := map[*types.Named]bool{} // what the allowed aliases stand for
	var walk func(where string, typ types.Type)
	walk = func(where string, typ types.Type) {
		switch x := typ.(type) {
		case *types.Alias:
			o := x.Obj()
			if o.Pkg() == pkg && allowed[o.Name()] {
				return
			}
			walk(where, x.Rhs())
		case *types.Named:
			o := x.Obj()
			if o.Pkg() != nil && internalPath(o.Pkg().Path()) && !allowedTargets[x] && (allowed == nil || o.Pkg().Path()+"."+o.Name() != outcomeType) {
				found = append(found, where+": "+o.Pkg().Path()+"."+o.Name())
				return
			}
			for i := 0; i < x.TypeArgs().Len(); i++ {
				walk(where, x.TypeArgs().At(i))
			}
			if o.Pkg() != pkg || seen[x] {
				return // another public package's type: its API is its own
			}
			seen[x] = true
			walk(where, x.Underlying())
			for i := 0; i < x.NumMethods(); i++ {
				if m := x.Method(i); m.Exported() {
					walk(where+"."+m.Name(), m.Type())
				}
			}
		case *types.Pointer:
			walk(where, x.Elem())
		case *types.Slice:
			walk(where, x.Elem())
		case *types.Array:
			walk(where, x.Elem())
		case *types.Chan:
			walk(where, x.Elem())
		case *types.Map:
			walk(where, x.Key())
			walk(where, x.Elem())
		case *types.Signature:
			for _, tup := range []*types.Tuple{x.Params(), x.Results()} {
				for i := 0; i < tup.Len(); i++ {
					walk(where, tup.At(i).Type())
				}
			}
		case *types.Struct:
			for i := 0; i < x.NumFields(); i++ {
				if f := x.Field(i); f.Exported() || f.Embedded() {
					walk(where+"."+f.Name(), f.Type())
				}
			}
		case *types.Interface:
			for i := 0; i < x.NumMethods(); i++ {
				walk(where+"."+x.Method(i).Name(), x.Method(i).Type())
			}
			for i := 0; i < x.NumEmbeddeds(); i++ {
				walk(where, x.EmbeddedType(i))
			}
		}
	}
	scope := pkg.Scope()
	for name := range allowed {
		if tn, ok := scope.Lookup(name).(*types.TypeName); ok {
			if n, ok := types.Unalias(tn.Type()).(*types.Named); ok {
				allowedTargets[n] = true
			}
		}
	}
	for _, name := range scope.Names() {
		o := scope.Lookup(name)
		if !o.Exported() {
			continue
		}
		if tn, ok := o.(*types.TypeName); ok && tn.IsAlias() && allowed[name] {
			continue
		}
		walk(name, o.Type())
	}
	sort.Strings(found)
	return found
}

// No exported API of runtime names a type of the actor layer or of an
// internal package (an application imports runtime only, and go doc
// shows the fields of what it gets), except through the aliases still
// listed in aliasedIntoActors.
func TestPublicAPIMentionsNoInternalPackage(t *testing.T) {
	pkg := runtimeAPI(t)
	for _, m := range apiMentions(pkg, aliasedIntoActors) {
		t.Errorf("exported API of runtime reaches an internal package: %s", m)
	}
	for name := range aliasedIntoActors {
		tn, ok := pkg.Scope().Lookup(name).(*types.TypeName)
		if !ok || !tn.IsAlias() {
			t.Errorf("%s is no longer an alias: remove it from aliasedIntoActors", name)
			continue
		}
		n, ok := types.Unalias(tn.Type()).(*types.Named)
		if !ok || n.Obj().Pkg() == nil || !internalPath(n.Obj().Pkg().Path()) {
			t.Errorf("%s is not an alias of an internal type: remove it from aliasedIntoActors", name)
		}
	}
	// The walk sees through aliases: without the allowance, the aliases
	// themselves are found.
	if len(apiMentions(pkg, nil)) < len(aliasedIntoActors) {
		t.Fatal("the walk does not find the listed aliases: it is broken")
	}
}

// aliasDocs parses the non-test sources of runtime in dir and returns the
// doc comment of each exported type alias: the spec's own comment, or the
// declaration's when the declaration has that one spec.
func aliasDocs(t *testing.T, dir string) map[string]string {
	t.Helper()
	fset := token.NewFileSet()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	docs := map[string]string{}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.TYPE {
				continue
			}
			for _, s := range gd.Specs {
				ts := s.(*ast.TypeSpec)
				if !ts.Assign.IsValid() || !ts.Name.IsExported() {
					continue
				}
				doc := ts.Doc
				if doc == nil && len(gd.Specs) == 1 {
					doc = gd.Doc
				}
				docs[ts.Name.Name] = doc.Text()
			}
		}
	}
	return docs
}

// undocumentedFields returns the exported fields of st that doc does not
// describe as a list item ("- Name ..." or "- A, Name, B ...", the way
// the aliases' comments list their fields).
func undocumentedFields(doc string, st *types.Struct) []string {
	var missing []string
	for i := 0; i < st.NumFields(); i++ {
		f := st.Field(i)
		if !f.Exported() {
			continue
		}
		item := regexp.MustCompile(`(?m)^\s*-\s+(?:[A-Z]\w*,\s*)*` + regexp.QuoteMeta(f.Name()) + `\b`)
		if !item.MatchString(doc) {
			missing = append(missing, f.Name())
		}
	}
	return missing
}

// Every exported alias of runtime into the actor layer (or an internal
// package) lists the fields of what it stands for in its own godoc: go
// doc shows an alias's comment, not the fields of its target.
func TestPublicAPIAliasDocsListFields(t *testing.T) {
	pkg := runtimeAPI(t)
	docs := aliasDocs(t, ".")
	checked := 0
	for _, name := range pkg.Scope().Names() {
		tn, ok := pkg.Scope().Lookup(name).(*types.TypeName)
		if !ok || !tn.Exported() || !tn.IsAlias() {
			continue
		}
		n, ok := types.Unalias(tn.Type()).(*types.Named)
		if !ok || n.Obj().Pkg() == nil || !internalPath(n.Obj().Pkg().Path()) {
			continue
		}
		doc, ok := docs[name]
		if !ok || strings.TrimSpace(doc) == "" {
			t.Errorf("%s (alias of %s) has no godoc", name, n.Obj().Pkg().Path()+"."+n.Obj().Name())
			continue
		}
		checked++
		st, ok := n.Underlying().(*types.Struct)
		if !ok {
			continue
		}
		if missing := undocumentedFields(doc, st); len(missing) > 0 {
			t.Errorf("godoc of %s (alias of %s) does not list its fields %s", name,
				n.Obj().Pkg().Path()+"."+n.Obj().Name(), strings.Join(missing, ", "))
		}
	}
	if checked < len(aliasedIntoActors) {
		t.Fatalf("checked %d aliases, fewer than the %d listed in aliasedIntoActors: the scan is broken", checked, len(aliasedIntoActors))
	}
	// The check can fail: a comment without the list misses every field.
	st := types.NewStruct([]*types.Var{
		types.NewField(token.NoPos, nil, "Through", types.Typ[types.Uint64], false),
		types.NewField(token.NoPos, nil, "Tail", types.Typ[types.Uint64], false),
		types.NewField(token.NoPos, nil, "hidden", types.Typ[types.Int], false),
	}, nil)
	if got := undocumentedFields("X says how far Through and Tail reach.\n", st); len(got) != 2 {
		t.Fatalf("prose mentions counted as a field list: missing = %v", got)
	}
	if got := undocumentedFields("X.\n\nFields:\n  - Through, Tail uint64: the range.\n", st); len(got) != 0 {
		t.Fatalf("a listed field is reported missing: %v", got)
	}
}
