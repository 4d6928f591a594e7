package bolt

import (
	"flag"
	"os"
	"testing"
)

// TestMain runs this package's tests with released transaction scratch
// poisoned (scratch.go): any record or value still pointing into a chunk
// after its transaction ended reads back wrong in whichever test touches
// it. Benchmarks run without, as production does.
func TestMain(m *testing.M) {
	flag.Parse()
	if f := flag.Lookup("test.bench"); f == nil || f.Value.String() == "" {
		scratchPoison.Store(true)
	}
	os.Exit(m.Run())
}
