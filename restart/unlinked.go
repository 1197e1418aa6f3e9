package restart

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// A file unlinked while a task holds it open has no path: a daemon that
// takes the connection over cannot find it by walking, and the kernel
// still names its node (an fstat, a setattr, an inherited handle opened
// again). So when a name whose file the daemon has open goes, the file's
// handle (name_to_handle_at) is recorded first, in
// <data-dir>/fuse/unlinked/<node ID in hex>:
//
//	{"root": "a1/web/secrets", "type": 1, "handle": "<base64>"}
//
// root is the volume root the file was in, as a path of the mount. A
// daemon that does not know the node looks up the name UnlinkedName(id)
// in that root: no name from the kernel holds a NUL, so only the
// takeover asks it, and the lookup opens the file by its handle and
// serves the node from that descriptor. The record goes when the kernel
// forgets the node.

// UnlinkedRecord is one record of unlinked/.
type UnlinkedRecord struct {
	Root   string `json:"root"`
	Type   int32  `json:"type"`
	Handle []byte `json:"handle"`
}

// Unlinked are the records of files unlinked while open below a data
// dir.
type Unlinked struct{ dataDir string }

// NewUnlinked returns the records of unlinked files of dataDir.
func NewUnlinked(dataDir string) Unlinked { return Unlinked{dataDir} }

func (u Unlinked) path(id uint64) string {
	return StateFile(u.dataDir, filepath.Join("unlinked", strconv.FormatUint(id, 16)))
}

// Save records the file of node id.
func (u Unlinked) Save(id uint64, rec UnlinkedRecord) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	return WriteReplace(u.path(id), b)
}

// Load reads the record of node id; false for none, or one that is not
// whole.
func (u Unlinked) Load(id uint64) (UnlinkedRecord, bool) {
	var rec UnlinkedRecord
	b, err := os.ReadFile(u.path(id))
	if err != nil || json.Unmarshal(b, &rec) != nil || rec.Root == "" {
		return UnlinkedRecord{}, false
	}
	return rec, true
}

// Remove removes the record of node id, if there is one.
func (u Unlinked) Remove(id uint64) { os.Remove(u.path(id)) }

// Paths are where node id, unlinked while open, may be found by lookup,
// from its record; nil for none.
func (u Unlinked) Paths(id uint64) [][]string {
	rec, ok := u.Load(id)
	if !ok {
		return nil
	}
	return [][]string{append(strings.Split(rec.Root, "/"), UnlinkedName(id))}
}

// UnlinkedPrefix starts the name UnlinkedName gives an unlinked node.
const UnlinkedPrefix = "\x00unlinked:"

// UnlinkedName is the name node id is looked up by in its volume root.
func UnlinkedName(id uint64) string { return UnlinkedPrefix + strconv.FormatUint(id, 16) }
