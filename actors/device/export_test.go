package device

// SetBeforeRedelivery makes the redelivery pass of every Device opened
// afterwards call f before it reads the store; restore undoes it.
func SetBeforeRedelivery(f func()) (restore func()) {
	beforeRedelivery = f
	return func() { beforeRedelivery = nil }
}
