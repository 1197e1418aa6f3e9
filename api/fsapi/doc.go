// Package fsapi serves Nomad's client file-system API, the endpoints
// behind `nomad alloc fs` and `nomad alloc logs`, over any allocdir.FS:
//
//	GET /v1/client/fs/ls/<alloc>?path=/             JSON array of AllocFileInfo
//	GET /v1/client/fs/stat/<alloc>?path=P           one AllocFileInfo
//	GET /v1/client/fs/cat/<alloc>?path=P            the file, raw
//	GET /v1/client/fs/readat/<alloc>?path=P&offset=O[&limit=L]
//	GET /v1/client/fs/stream/<alloc>?path=P[&offset=O][&origin=start|end][&follow=true]
//	GET /v1/client/fs/logs/<alloc>?task=T&type=stdout|stderr[&offset=O]
//	    [&origin=start|end][&follow=false][&plain=false]
//
// Parameters, defaults, validation messages and status codes are Nomad's
// (see ../shared/docs/nomad-compat.md §6): a missing allocation ID, path,
// task or log type is a 400 with Nomad's message; an unknown or collected
// allocation, or a missing file, is a 404. Where Nomad answers 500 for a
// refusal, this package answers what the refusal is: 400 for a path that
// escapes the allocation, 403 for reads under secrets/ or private/.
//
// # Framing
//
// stream and logs (unless plain) answer with a sequence of JSON frames,
// concatenated as Nomad writes them:
//
//	{"Offset":1024,"Data":"<base64>","File":"alloc/logs/web.stdout.0"}
//	{"Offset":0,"File":"alloc/logs/web.stdout.0","FileEvent":"file truncated"}
//	{}
//
// Data is batched for 200 ms or until 64 KiB, a frame for another file or
// event flushes the current one first, and an empty frame {} is a
// heartbeat, sent every second. A frame's Offset is the file position after
// the first chunk it carries, the same quirk as Nomad's, which clients
// rely on to resume. In plain mode (logs plain=true; cat and readat
// always) only the data bytes are written.
//
// # Following
//
// Followers wait on the allocdir.FS's ChangeEvents and BlockUntilExists;
// with fs.AllocDir those are woken by the kernel's events on the backing
// store, so a write reaches a follower at the next flush, with no polling.
// A truncated file restarts at 0 with a "file truncated" frame; a deleted
// one ends with "file deleted". The logs endpoint follows a task's
// numbered log files across rotation: it moves from <task>.<type>.N to
// the next index as soon as that appears, after reading what N still had.
//
// Content never goes to a browser as something it would render: raw
// answers are application/octet-stream or text/plain with nosniff.
package fsapi
