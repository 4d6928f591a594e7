//go:build soak

package hosting_test

import "time"

// The soak build (make soak) runs the fault harness for many rounds: the
// take-over percentiles then come from dozens of SIGKILLs.
func init() { faultRounds, checkTimeout = 12, 20*time.Minute }
