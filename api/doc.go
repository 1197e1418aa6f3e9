// Package api is the HTTP side of allocfs: its wire types, the server
// that answers them over a Node (the lifecycle service, package node),
// and the Go client the CLI uses. It imports neither the store nor the
// FUSE code, so the client builds on Linux and the BSDs, macOS included
// (make darwin checks it).
//
// # The control API
//
// Requests and answers are JSON. Every error answer has the body
// {"error": "..."} and a status code chosen from the error's sentinel in one
// place (StatusCode):
//
//	POST   /v1/allocs            create an allocation, migrating
//	                             a previous one's data   201, 400, 403, 404,
//	                                                     409, 502
//	GET    /v1/allocs            list allocations        200
//	GET    /v1/allocs/{id}       status of one           200, 400, 404, 410
//	POST   /v1/allocs/{id}/stop  make it terminal        200, 404, 410
//	POST   /v1/allocs/{id}/gc    collect a terminal one  200, 404, 409, 410
//	DELETE /v1/allocs/{id}       destroy one             204, 400, 404, 409, 410
//	POST   /v1/gc                collect every terminal  200
//	GET    /v1/status            the node                200
//	GET    /v1/agent/health      Nomad's health check    200, 500
//
// 404 means the daemon never knew the allocation; 410 means it was
// destroyed since the daemon started; 403 and 502 are another node's
// refusal or failure during a remote migration.
//
// Nomad's client API is answered too (ClientAPI): the fs endpoints of
// package fsapi, forced GC, and GET /v1/allocations?prefix= (Nomad's
// allocation stubs, how a client turns an ID prefix into an ID). It is
// what a node serves other machines behind its token: NodeHandler puts
// each route of the TCP listener behind its token (the API token, or the
// snapshot checker of package migrate), as X-Nomad-Token or a Bearer
// header, and logs refusals at a bounded rate (Linux only, with the node).
//
// # The client
//
// NewClient dials the daemon's unix socket; NewRemoteClient reaches a
// node's TCP listener, with a token and TLS, where only the client API
// answers. Errors come back as *Error, which errors.Is matches against
// the same sentinels the server mapped to a status.
package api
