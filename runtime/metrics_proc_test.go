package runtime

import goruntime "runtime"

// processMetricsSupported: the process collector reads /proc (Linux) or
// the platform's equivalent; elsewhere it exports nothing.
func processMetricsSupported() bool {
	return goruntime.GOOS == "linux" || goruntime.GOOS == "windows" || goruntime.GOOS == "darwin"
}
