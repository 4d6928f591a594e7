package clock

import "errors"

// ErrExhausted is returned when the HLC would pass its 48-bit physical range.
var ErrExhausted = errors.New("clock: hlc range exhausted")

// ErrHeld is returned by Now and Reserve while the clock is held: the
// node does not yet know the highest HLC it released (a restore, SSP/1
// §13.5), so it issues nothing until Release.
var ErrHeld = errors.New("clock: held until the node has learned its released history")

// ErrStopped is returned by Now and Reserve after Stop (the node closes).
var ErrStopped = errors.New("clock: stopped")
