// Package persistence defines the storage contract of a syncmesh node: the
// transactions the actors run, the records they read and write, and the
// errors every implementation returns. bolt/ implements it on bbolt (the
// embedded default, sealed at rest); memory/ implements the same contract in
// memory without encryption; storetest/ is the one contract suite both pass.
//
// The actors own the decisions; a Store only keeps what it is given, inside
// one transaction per Update, durable when Update returns nil.
package persistence
