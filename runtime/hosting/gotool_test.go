package hosting_test

import (
	"go/build"
	"os/exec"
	"path/filepath"
)

// goTool is the go command the tests build their child programs with: the
// one on PATH, else the one of the toolchain's root.
func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return filepath.Join(build.Default.GOROOT, "bin", "go")
}
