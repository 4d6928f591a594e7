package session

// MaxStoredPending is maxStoredPending for the external tests.
const MaxStoredPending = maxStoredPending
