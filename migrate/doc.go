// Package migrate moves an allocation's ephemeral disk between nodes: the
// source node serves a snapshot of it, the destination fetches, checks and
// extracts that snapshot into its staging area.
//
// # How a remote migration flows
//
// When a replacement allocation lands on another node than its
// predecessor and asks for its data (Nomad's ephemeral_disk with
// migrate = true), the destination node:
//
//  1. learns the source node's address and a migrate token for the
//     previous allocation from the control plane;
//  2. calls [Fetch], which sends
//     GET /v1/client/allocation/<prevAllocID>/snapshot with the token in
//     the X-Nomad-Token header;
//  3. on the source, [SnapshotHandler] checks the token before it looks at
//     anything, then streams Nomad's migration tar (alloc/data, then each
//     task's local/; see snapshot.Write) straight from the store,
//     hashing it on the way;
//  4. Fetch pipes the response body through a CRC-32C hasher and a 1 MiB
//     read-ahead into snapshot.Extract, which checks every entry
//     (no escape by name, symbolic or hard link, no device, size and
//     count limits) and writes into a private directory inside the
//     staging directory;
//  5. once the archive was read to its end-of-archive marker, Fetch reads
//     the HTTP trailer X-Allocfs-Snapshot-Crc32c and compares it with
//     what it hashed;
//  6. the caller turns the extracted directory, [Fetched.Dir], into a
//     layer of the new allocation (a rename inside the store's data
//     directory) and remaps the allocation onto it.
//
// The body is exactly Nomad's tar: the digest travels as an HTTP trailer,
// which Nomad's clients ignore, so a stock Nomad client can migrate from
// an allocfs node. Fetch also accepts a stock Nomad source, which sends no
// trailer; the archive's own end-of-archive check then stands alone
// ([Fetched.Verified] is false).
//
// # Guarantees
//
// All or nothing. Fetch returns a directory only when the whole archive
// arrived, every entry was accepted and the digest, when sent, matched.
// Any failed attempt leaves nothing in the staging directory: the
// extractor removes its partial tree itself, and a tree that was complete
// but whose digest did not match is removed by Fetch. The source's data
// is only ever read. A daemon killed mid-transfer leaves a hidden
// partial directory that the store's staging cleanup removes at its next
// start.
//
// Retries are bounded and only for what can get better: a connection that
// could not be made, was cut or stalled (an archive that ends early, at a
// block boundary or not, counts as cut), a digest mismatch, 5xx and 429
// (whose Retry-After is honoured up to [MaxBackoff]). Each retry starts
// over from the first byte, after a backoff that doubles from
// FetchOptions.Backoff. Never retried: a refused token (403,
// [ErrPermissionDenied]), an unknown or collected allocation (404, 410:
// allocdir.ErrUnknownAlloc, allocdir.ErrGone), any other 4xx, an archive
// refused for its content (allocdir.ErrArchive: a malicious entry, a limit,
// or the sender's own NOMAD-<id>-ERROR.log entry saying its snapshot
// failed), a refused TLS certificate, a local failure such as a full disk,
// and the cancellation of the caller's context. A transfer that receives nothing for
// FetchOptions.StallTimeout, or fewer than FetchOptions.MinProgressBytes in
// a FetchOptions.MinProgressWindow ([ErrTooSlow]), is abandoned and
// retried; the whole fetch, waits included, ends at FetchOptions.Deadline
// ([ErrDeadline], 30 minutes by default).
//
// # Tokens
//
// The snapshot endpoint does not use ordinary API tokens: the only
// question is whether the caller may read this one allocation's data. A
// [TokenChecker] answers it. [SharedToken] is one secret for the whole
// cluster. [NodeSecretToken] follows Nomad's migrate-token scheme: the
// source node's secret keys BLAKE2b-512 over the allocation ID, so a token opens exactly one allocation of one node and
// only the control plane, which knows every node's secret, can mint it
// ([NodeSecretToken.Derive]). Both compare in constant time and refuse an
// empty token; a refused request gets 403 "Permission denied" before
// anything is looked up or read.
//
// # Progress
//
// FetchOptions.Progress receives the bytes received, the size when the
// source announced it, and the rate, at most every 200 ms.
// The daemon passes them on to the client that asked (api.ProgressEvent),
// whose CLI renders them for a terminal or a log.
package migrate
