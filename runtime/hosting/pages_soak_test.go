//go:build soak

package hosting_test

// The soak build (make soak) pages full-size frames: MaxPageBytes as
// shipped, with more than MaxFrame of rows, changes and messages.
func init() { fullFramePages = true }
