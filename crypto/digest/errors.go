package digest

import "errors"

// ErrStored is matched (errors.Is) by every DecodeStored failure.
var ErrStored = errors.New("digest: invalid stored digest")
