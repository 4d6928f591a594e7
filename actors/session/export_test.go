package session

// MaxStoredPending is maxStoredPending for the external tests.
const MaxStoredPending = maxStoredPending

// MaxKnownSent is maxKnownSent for the external tests.
const MaxKnownSent = maxKnownSent
