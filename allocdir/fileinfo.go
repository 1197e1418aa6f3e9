package allocdir

import (
	"io/fs"
	"net/http"
	"strings"
	"time"
)

// FileInfo describes one file of an allocation. Its JSON encoding is
// identical to Nomad's AllocFileInfo, so API clients decode it unchanged.
type FileInfo struct {
	Name        string
	IsDir       bool
	Size        int64
	FileMode    string
	ModTime     time.Time
	ContentType string `json:",omitempty"`
}

// NewFileInfo converts an fs.FileInfo without a content type, as List
// reports entries.
func NewFileInfo(fi fs.FileInfo) *FileInfo {
	return &FileInfo{
		Name:     fi.Name(),
		IsDir:    fi.IsDir(),
		Size:     fi.Size(),
		FileMode: fi.Mode().String(),
		ModTime:  fi.ModTime(),
	}
}

// sniffLen is how much of a file content-type detection looks at; it is
// what http.DetectContentType considers.
const sniffLen = 512

// DetectContentType applies Nomad's rules to a stat result: a name ending
// in .json is application/json whatever it is; a directory, or a file that
// could not be read (head is nil or empty), is application/octet-stream;
// otherwise the type sniffed from the first bytes.
func DetectContentType(name string, isDir bool, head []byte) string {
	if strings.HasSuffix(name, ".json") {
		return "application/json"
	}
	if isDir || len(head) == 0 {
		return "application/octet-stream"
	}
	if len(head) > sniffLen {
		head = head[:sniffLen]
	}
	return http.DetectContentType(head)
}
