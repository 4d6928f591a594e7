package messages

// RecordType numbers a kind of record sealed at rest. It lives here, below
// both crypto/sealed (which binds it into the associated data) and
// persistence (which names the types its stores seal), so the storage
// cipher depends on nothing above this package. The numbers themselves
// are assigned in persistence (persistence.RecordEvent, …).
type RecordType uint8
