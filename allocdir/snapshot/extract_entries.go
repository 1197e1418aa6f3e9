//go:build linux

package snapshot

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"path"
	"strings"
	"unicode/utf8"

	"github.com/allocfs/allocfs/allocdir"
	"golang.org/x/sys/unix"
)

// What an entry may be: its name (clean, inside the layout, not too long),
// its type (only those a snapshot writer makes), its IDs; and the errors
// that refuse one, which name the entry without echoing a hostile name in
// full. countingReader keeps the archive's tail to tell a cut stream from
// a complete one.

// readError classifies a failure of the tar reader: a failing source is
// the transport's fault, anything else is the archive's.
func readError(cr *countingReader, name string, err error) error {
	if cr.err != nil && cr.err != io.EOF {
		if name == "" {
			return fmt.Errorf("failed to read snapshot: %w", err)
		}
		return fmt.Errorf("failed to read snapshot entry %q: %w", shortName(name), err)
	}
	what := "corrupt archive"
	if errors.Is(err, io.ErrUnexpectedEOF) {
		what = "archive truncated"
	}
	if name == "" {
		return fmt.Errorf("%w: %s: %w", allocdir.ErrArchive, what, err)
	}
	return fmt.Errorf("%w: entry %q: %s: %w", allocdir.ErrArchive, shortName(name), what, err)
}

// shortName is an entry's name as error messages show it: whole up to
// 256 bytes, longer names (they may run to maxNameLen) by their two ends.
func shortName(name string) string {
	const end = 120
	if len(name) <= 2*end+16 {
		return name
	}
	return fmt.Sprintf("%s...[%d bytes]...%s", name[:end], len(name)-2*end, name[len(name)-end:])
}

func refuse(name, format string, args ...any) error {
	return fmt.Errorf("%w: entry %q: %s", allocdir.ErrArchive, shortName(name), fmt.Sprintf(format, args...))
}

func refuseType(name, what string) error {
	return fmt.Errorf("%w: entry %q: %w: %s", allocdir.ErrArchive, shortName(name), ErrEntryType, what)
}

func refuseDuplicate(name string, err error) error {
	return fmt.Errorf("%w: entry %q: duplicate entry (the name was already extracted): %w", allocdir.ErrArchive, shortName(name), err)
}

// paxSparsePrefix starts the PAX records of every GNU sparse format
// (0.0, 0.1 and 1.0).
const paxSparsePrefix = "GNU.sparse."

// checkType refuses what no snapshot writer produces. Nomad's writer and
// Write only ever write directories, regular files and symbolic
// links, each name as itself.
func checkType(name string, hdr *tar.Header) error {
	for k := range hdr.PAXRecords {
		if strings.HasPrefix(k, paxSparsePrefix) {
			return refuseType(name, fmt.Sprintf("sparse file (PAX record %q)", k))
		}
	}
	switch hdr.Typeflag {
	case tar.TypeDir, tar.TypeReg, tar.TypeSymlink:
		return nil
	case tar.TypeGNUSparse:
		return refuseType(name, "sparse file (GNU format)")
	case tar.TypeLink:
		return refuseType(name, fmt.Sprintf("hard link to %q", hdr.Linkname))
	case tar.TypeFifo:
		return refuseType(name, "FIFO")
	case tar.TypeChar, tar.TypeBlock:
		return refuseType(name, "device node")
	}
	return refuseType(name, fmt.Sprintf("type %q", hdr.Typeflag))
}

// validID admits what a uid_t holds, except -1, which chown reads as
// "leave it alone".
func validID(id int) bool { return id >= 0 && id < math.MaxUint32 }

func isErrorEntryName(name string) bool {
	return len(name) >= len("NOMAD--ERROR.log") &&
		strings.HasPrefix(name, "NOMAD-") && strings.HasSuffix(name, "-ERROR.log")
}

// senderError turns the sender's error entry into the refusal it means.
func senderError(tr *tar.Reader, name string) error {
	body, err := io.ReadAll(io.LimitReader(tr, maxErrorBody))
	if err != nil {
		return fmt.Errorf("%w: entry %q: sender reported an error that could not be read: %w", allocdir.ErrArchive, shortName(name), err)
	}
	msg := strings.TrimSpace(strings.ToValidUTF8(string(body), string(utf8.RuneError)))
	return refuse(name, "sender reported: %s", msg)
}

// cleanEntryName checks a raw entry name and returns it cleaned. A ".."
// is refused wherever it appears, even where it would clean away: such a
// name is never produced by a sender, only crafted.
func cleanEntryName(raw string) (string, error) {
	switch {
	case raw == "":
		return "", errors.New("empty name")
	case len(raw) > maxNameLen:
		return "", fmt.Errorf("name longer than %d bytes", maxNameLen)
	case strings.IndexByte(raw, 0) >= 0:
		return "", errors.New("name contains NUL")
	case strings.HasPrefix(raw, "/"):
		return "", errors.New("absolute name")
	}
	for _, c := range strings.Split(raw, "/") {
		if c == ".." {
			return "", errors.New(`name contains ".."`)
		}
	}
	name := path.Clean(raw)
	if name == "." {
		return "", errors.New("name is the archive root")
	}
	return name, nil
}

// checkLayout admits only what a snapshot can hold: alloc/data and every
// task's local/, plus the directories above them.
func checkLayout(comps []string) error {
	top := comps[0]
	if top == allocdir.SharedAllocName {
		if len(comps) == 1 || comps[1] == allocdir.SharedDataName {
			return nil
		}
		return fmt.Errorf("outside %s/%s", allocdir.SharedAllocName, allocdir.SharedDataName)
	}
	if err := allocdir.ValidName(top); err != nil {
		return err
	}
	if len(comps) == 1 || comps[1] == allocdir.TaskLocal {
		return nil
	}
	return fmt.Errorf("outside %s/%s", top, allocdir.TaskLocal)
}

// fsError classifies a failed filesystem call: a link or a non-directory
// in the way can only come from the archive, anything else (ENOSPC, EIO,
// EPERM) is this node's problem.
func fsError(entry string, err error) error {
	switch {
	case errors.Is(err, unix.ELOOP), errors.Is(err, unix.EXDEV):
		return fmt.Errorf("%w: entry %q: path runs through a symbolic link: %w", allocdir.ErrArchive, shortName(entry), err)
	case errors.Is(err, unix.ENOTDIR):
		return fmt.Errorf("%w: entry %q: parent is not a directory: %w", allocdir.ErrArchive, shortName(entry), err)
	case errors.Is(err, unix.EEXIST):
		return refuseDuplicate(entry, err)
	}
	return fmt.Errorf("failed to extract entry %q: %w", shortName(entry), err)
}

// countingReader counts what the tar reader consumed, keeps the last
// trailerSize bytes of it and remembers the source's first error, which
// is what makes a missing trailer and a failing source detectable.
type countingReader struct {
	r    io.Reader
	n    int64
	tail []byte
	err  error
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if n > 0 {
		c.n += int64(n)
		c.remember(p[:n])
	}
	if err != nil && c.err == nil {
		c.err = err
	}
	return n, err
}

func (c *countingReader) remember(b []byte) {
	if len(b) >= trailerSize {
		c.tail = append(c.tail[:0], b[len(b)-trailerSize:]...)
		return
	}
	if keep := trailerSize - len(b); len(c.tail) > keep {
		c.tail = append(c.tail[:0], c.tail[len(c.tail)-keep:]...)
	}
	c.tail = append(c.tail, b...)
}

func (c *countingReader) tailIsZero() bool {
	return len(c.tail) == trailerSize && bytes.Count(c.tail, []byte{0}) == trailerSize
}
