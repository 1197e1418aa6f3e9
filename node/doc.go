// Package node is the one home of an allocfs node's lifecycle: creating
// allocations (with the migration of a previous one's data, local or
// fetched from another node), stopping, destroying and collecting them,
// and the pins that keep one alive while its snapshot streams away.
//
// The Service implements api.Node, so the HTTP handlers are thin adapters
// over it, and everything that changes an allocation goes through the
// store it owns. It owns the node's one collector too: garbage collection
// asked for over the control API, over Nomad's client API, from the CLI
// (which calls the control API) and by the timer (Service.Run) takes the
// same path, gc.Collector, which skips pinned allocations and ends
// every pass by flattening snapshot chains.
//
// What a migration does, by the previous allocation's place and policy:
//
//	no previous, or policy none   a fresh allocation
//	previous here, sticky/migrate store.Create with MigrationAdopt or
//	                              MigrationSnapshot: its layers are
//	                              adopted or sealed under a new upper,
//	                              O(1), no byte copied
//	previous on another node      migrate.Fetch streams its snapshot into
//	                              staging, checked; store.Create with
//	                              MigrationRemote takes the staged
//	                              directories as layers
//
// Errors leave the service marked with the api kind that decides their
// status code (api.Kind): a caller over HTTP and a caller in process see
// the same errors.Is answers.
package node
