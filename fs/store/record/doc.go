// Package record is the allocation record as it lies on disk: what one
// allocation is, in state/<allocID>.json of the store's data dir (and in
// the intents of its journal), and the checks a record must pass before
// the store writes it or after it reads one back.
//
// # The record on disk
//
// A record names, for each mount point of the allocation, the stack of
// layers behind it, by layer ID; everything else is about the allocation
// as a whole:
//
//	{
//	  "id": "5b1a...",
//	  "tasks": [{"Name": "web", "SecretsMB": 0, "User": ""}],
//	  "status": "running",
//	  "created": "2026-12-01T10:00:00Z",
//	  "volumes": {
//	    "alloc/data": {"upper": "9f3c...", "lowers": ["41d0..."]},
//	    "alloc/logs": {"upper": "a7e2..."},
//	    "alloc/tmp":  {"upper": "e05d..."},
//	    "web":        {"upper": "37aa..."},
//	    "web/local":  {"upper": "c81b..."},
//	    "web/tmp":    {"upper": "0b6f..."}
//	  },
//	  "disk": {"bytes": 104857600, "group": 2000001, "from": "request"}
//	}
//
// Layers are named by ID, never by path, so that the data dir can move
// and two allocations can stack one layer (a snapshot migration) without
// either owning the other's paths. An allocation's volumes are fixed by
// its layout (VolumeSpecs): alloc/data, alloc/logs and alloc/tmp, and
// each task's directory, local/ and tmp/; secrets/ and private/ live in
// memory only and have none.
//
// # Why it is a package of its own
//
// The record is the contract between the store, which changes records
// crash-atomically, and everything that reads them: the FUSE tree lays
// an allocation out from its record, the quota mechanisms (package
// quota) make the kernel's groups agree with the records' limits, and
// the node and the metrics report them. None of those needs the store's
// journal or its locks to know what a record says, and a change of the
// record's shape is a change of the disk format, which this package
// holds in one place. It does no I/O beyond reading one record file
// (Read); writing, journaling and replaying records is the store's.
//
// Validate says what the store relies on in a record, whether it was
// read from disk, replayed from the journal or produced by an update: a
// record that passes can be written and read back. Normalize gives a
// record the shape a JSON round trip gives it, so that what the store
// holds in memory is exactly what it would read back.
package record
