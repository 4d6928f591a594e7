package bolt

// markInitiationV2 is layout 9: the delivery plane's initiation version 2
// (docs/delivery.md, "Initiation version 2"). It rewrites nothing. The
// sealed records it concerns are opaque here and upgrade on their next
// write: the prekey store gains the accepted last-resort initiation ids,
// session records gain skipped-key times, and a session whose unanswered
// initiation is of version 1 is dropped when its record is loaded. What
// the version number does is stop a build of layout 8 from opening a file
// whose records it could no longer decode (ErrLayoutVersion at Open
// instead of a corrupt-record error on the first message).
func markInitiationV2(*wtx) error { return nil }
