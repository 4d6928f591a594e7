package sealed

import (
	"go/build"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestCryptoImportsNothingAboveMessages (imports only downward): the crypto
// packages, the storage cipher included, depend only on each other and on
// messages — `go list -deps ./crypto/...` lists no persistence package.
// The stores adapt the cipher's errors (persistence/bolt maps ErrOpen to
// persistence.ErrCorrupt).
func TestCryptoImportsNothingAboveMessages(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(build.Default.GOROOT, "bin", "go")
	}
	const mod = "github.com/syncmesh/syncmesh/"
	out, err := exec.Command(goBin, "list", "-deps", mod+"crypto/...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	seen := 0
	for _, p := range strings.Fields(string(out)) {
		if !strings.HasPrefix(p, mod) {
			continue
		}
		seen++
		rel := strings.TrimPrefix(p, mod)
		if !strings.HasPrefix(rel, "crypto/") && rel != "messages" && !strings.HasPrefix(rel, "messages/") {
			t.Errorf("the crypto packages depend on %s", p)
		}
	}
	if seen == 0 || !strings.Contains(string(out), mod+"crypto/sealed\n") {
		t.Fatalf("go list -deps did not list the crypto packages:\n%s", out)
	}
}
