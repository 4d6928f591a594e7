package hosting

// SetPageByteLimit lowers the page byte bound for a test (restored at the
// test's end), so paging by size is exercised without 16 MiB of data.
func SetPageByteLimit(n int) (restore func()) {
	old := pageByteLimit
	pageByteLimit = n
	return func() { pageByteLimit = old }
}
