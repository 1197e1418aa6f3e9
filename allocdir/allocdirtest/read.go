//go:build linux

package allocdirtest

import (
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/allocfs/allocfs/allocdir"
)

// readFixtures is the tree the read-side cases share.
func readFixtures(t *testing.T, a allocdir.Interface) {
	t.Helper()
	apply(t, a.AllocDirPath(),
		file("alloc/data/b.txt", "bravo\n", 0o644),
		file("alloc/data/a.txt", "alpha\n", 0o600),
		dir("alloc/data/dir", 0o755),
		file("alloc/data/dir/inner", "inner", 0o644),
		symlink("alloc/data/link", "a.txt"),
		symlink("alloc/data/dirlink", "dir"),
		file("alloc/data/digits", "0123456789", 0o644),
		file("alloc/data/empty", "", 0o644),
		file("alloc/data/text.txt", "hello world\n", 0o644),
		file("alloc/data/conf.json", "{}", 0o644),
		dir("alloc/data/x.json", 0o755),
		file("alloc/data/bin", "\x00\x01\x02\x03", 0o644),
		file("alloc/logs/web.stdout.0", "log line\n", 0o644),
		file("web/secrets/token", "s3cr3t", 0o600),
		file("web/private/vault", "pr1v4t3", 0o600),
		file("web/local/conf", "local conf", 0o644),
		file("alloc/data/secrets/x", "not a secret", 0o644),
		file("web/local/secrets/x", "not a secret either", 0o644),
		fifo("alloc/data/fifo"),
	)
}

// testList checks List: sorted names, lstat information, no content type,
// the root, secrets/ listing and missing paths.
func testList(t *testing.T, h *harness) {
	a := h.built(t, allocA, "web")
	readFixtures(t, a)

	// Entries come back sorted by name with their sizes and no content type.
	t.Run("Sorted", func(t *testing.T) {
		infos, err := a.List("alloc/data/dir/..")
		if err != nil {
			t.Fatalf("List: %v", err)
		}
		got := names(infos)
		want := []string{"a.txt", "b.txt", "bin", "conf.json", "digits", "dir", "dirlink", "empty", "fifo", "link", "secrets", "text.txt", "x.json"}
		if !slices.Equal(got, want) {
			t.Errorf("List(alloc/data): got %v, want %v", got, want)
		}
		if fi := find(infos, "b.txt"); fi == nil || fi.Size != 6 || fi.IsDir || fi.FileMode != "-rw-r--r--" {
			t.Errorf("List entry b.txt: got %s, want size 6, -rw-r--r--, not a dir", describe(fi))
		}
		if fi := find(infos, "dir"); fi == nil || !fi.IsDir || fi.FileMode != "drwxr-xr-x" {
			t.Errorf("List entry dir: got %s, want a drwxr-xr-x dir", describe(fi))
		}
		for _, fi := range infos {
			if fi.ContentType != "" {
				t.Errorf("List entry %s: got ContentType %q, want none", fi.Name, fi.ContentType)
			}
		}
	})

	// Symbolic links are listed as themselves: mode "L...", not a dir, size
	// of the target string.
	t.Run("Lstat", func(t *testing.T) {
		infos, err := a.List("alloc/data")
		if err != nil {
			t.Fatalf("List: %v", err)
		}
		for name, target := range map[string]string{"link": "a.txt", "dirlink": "dir"} {
			fi := find(infos, name)
			if fi == nil {
				t.Errorf("List: no entry %s", name)
				continue
			}
			if !strings.HasPrefix(fi.FileMode, "L") || fi.IsDir {
				t.Errorf("List entry %s: got mode %q IsDir %v, want a mode starting with L and IsDir false", name, fi.FileMode, fi.IsDir)
			}
			if fi.Size != int64(len(target)) {
				t.Errorf("List entry %s: got size %d, want %d (length of the target)", name, fi.Size, len(target))
			}
		}
		if fi := find(infos, "fifo"); fi == nil || !strings.HasPrefix(fi.FileMode, "p") {
			t.Errorf("List entry fifo: got %s, want a mode starting with p", describe(fi))
		}
	})

	// A link to a directory inside the allocation can be listed through.
	t.Run("ThroughLink", func(t *testing.T) {
		infos, err := a.List("alloc/data/dirlink")
		if err != nil {
			t.Fatalf("List(alloc/data/dirlink): %v", err)
		}
		if got := names(infos); !slices.Equal(got, []string{"inner"}) {
			t.Errorf("List(alloc/data/dirlink): got %v, want [inner]", got)
		}
	})

	// secrets/ and private/ can be listed: names and sizes are visible.
	t.Run("Secrets", func(t *testing.T) {
		for p, name := range map[string]string{"web/secrets": "token", "web/private": "vault"} {
			infos, err := a.List(p)
			if err != nil {
				t.Errorf("List(%s): %v", p, err)
				continue
			}
			if fi := find(infos, name); fi == nil || fi.Size == 0 {
				t.Errorf("List(%s): got %v, want an entry %s with its size", p, names(infos), name)
			}
		}
	})

	// "/" and "" both list the allocation root.
	t.Run("Root", func(t *testing.T) {
		for _, p := range []string{"/", "", ".", "//"} {
			infos, err := a.List(p)
			if err != nil {
				t.Errorf("List(%q): %v", p, err)
				continue
			}
			if got, want := names(infos), []string{"alloc", "web"}; !slices.Equal(got, want) {
				t.Errorf("List(%q): got %v, want %v", p, got, want)
			}
		}
	})

	// A missing directory is fs.ErrNotExist; a file is not a directory.
	t.Run("Errors", func(t *testing.T) {
		if infos, err := a.List("alloc/data/missing"); !errors.Is(err, fs.ErrNotExist) || len(infos) != 0 {
			t.Errorf("List(missing): got (%v, %v), want no entries and an error wrapping fs.ErrNotExist", names(infos), err)
		}
		if infos, err := a.List("alloc/data/a.txt"); err == nil {
			t.Errorf("List(a file): got %v and no error, want an error", names(infos))
		}
	})
}

// testStat checks Stat: links followed, content types, the root's name,
// secrets allowed, FIFOs, and the JSON shape of FileInfo.
func testStat(t *testing.T, h *harness) {
	a := h.built(t, allocA, "web")
	readFixtures(t, a)

	// Stat follows links and keeps the requested name.
	t.Run("FollowsLinks", func(t *testing.T) {
		fi, err := a.Stat("alloc/data/link")
		if err != nil {
			t.Fatalf("Stat(link): %v", err)
		}
		if fi.Name != "link" || fi.IsDir || fi.Size != 6 || fi.FileMode != "-rw-------" {
			t.Errorf("Stat(link): got %s, want {link -rw------- size=6}", describe(fi))
		}
		fi, err = a.Stat("alloc/data/dirlink")
		if err != nil {
			t.Fatalf("Stat(dirlink): %v", err)
		}
		if !fi.IsDir {
			t.Errorf("Stat(dirlink): got %s, want a directory", describe(fi))
		}
	})

	// ContentType follows Nomad's rules: .json wins, directories and empty
	// files are octet-stream, otherwise sniffed.
	t.Run("ContentType", func(t *testing.T) {
		for p, want := range map[string]string{
			"alloc/data/conf.json": "application/json",
			"alloc/data/x.json":    "application/json",
			"alloc/data/text.txt":  "text/plain; charset=utf-8",
			"alloc/data/empty":     "application/octet-stream",
			"alloc/data/dir":       "application/octet-stream",
			"alloc/data/bin":       "application/octet-stream",
		} {
			fi, err := a.Stat(p)
			if err != nil {
				t.Errorf("Stat(%s): %v", p, err)
				continue
			}
			if fi.ContentType != want {
				t.Errorf("Stat(%s).ContentType: got %q, want %q", p, fi.ContentType, want)
			}
		}
	})

	// Stat of the root is named after the allocation.
	t.Run("Root", func(t *testing.T) {
		for _, p := range []string{"/", ""} {
			fi, err := a.Stat(p)
			if err != nil {
				t.Errorf("Stat(%q): %v", p, err)
				continue
			}
			if fi.Name != allocA || !fi.IsDir {
				t.Errorf("Stat(%q): got %s, want a directory named %s", p, describe(fi), allocA)
			}
		}
	})

	// Modes print as Go's FileMode.String, the sticky task tmp/ included,
	// and ModTime is the file's.
	t.Run("ModeAndTime", func(t *testing.T) {
		fi, err := a.Stat("web/tmp")
		if err != nil {
			t.Fatalf("Stat(web/tmp): %v", err)
		}
		if fi.FileMode != "dtrwxrwxrwx" {
			t.Errorf("Stat(web/tmp).FileMode: got %q, want %q", fi.FileMode, "dtrwxrwxrwx")
		}
		osfi, err := os.Stat(host(a, "alloc/data/text.txt"))
		if err != nil {
			t.Fatal(err)
		}
		fi, err = a.Stat("alloc/data/text.txt")
		if err != nil {
			t.Fatalf("Stat(text.txt): %v", err)
		}
		if d := fi.ModTime.Sub(osfi.ModTime()); d > time.Second || d < -time.Second {
			t.Errorf("Stat(text.txt).ModTime: got %v, want %v", fi.ModTime, osfi.ModTime())
		}
	})

	// Stat of content under secrets/ and private/ is allowed.
	t.Run("Secrets", func(t *testing.T) {
		for p, size := range map[string]int64{"web/secrets/token": 6, "web/private/vault": 7} {
			fi, err := a.Stat(p)
			if err != nil {
				t.Errorf("Stat(%s): %v", p, err)
				continue
			}
			if fi.Size != size {
				t.Errorf("Stat(%s).Size: got %d, want %d", p, fi.Size, size)
			}
		}
	})

	// Stat of a FIFO returns promptly (content sniffing must not block).
	t.Run("FIFO", func(t *testing.T) {
		var fi *allocdir.FileInfo
		var err error
		if !within(hangTimeout, func() { fi, err = a.Stat("alloc/data/fifo") }) {
			unblockFIFO(host(a, "alloc/data/fifo"))
			t.Fatalf("Stat(fifo) still blocked after %v", hangTimeout)
		}
		if err != nil {
			t.Fatalf("Stat(fifo): %v", err)
		}
		if !strings.HasPrefix(fi.FileMode, "p") {
			t.Errorf("Stat(fifo).FileMode: got %q, want a mode starting with p", fi.FileMode)
		}
	})

	// A missing path is fs.ErrNotExist.
	t.Run("NotExist", func(t *testing.T) {
		wantNotExist(t, a, "alloc/data/missing")
		wantNotExist(t, a, "nosuchtask/local")
	})

	// FileInfo encodes to exactly Nomad's AllocFileInfo keys, ContentType
	// omitted when empty.
	t.Run("JSON", func(t *testing.T) {
		fi, err := a.Stat("alloc/data/text.txt")
		if err != nil {
			t.Fatalf("Stat: %v", err)
		}
		wantKeys(t, fi, "ContentType", "FileMode", "IsDir", "ModTime", "Name", "Size")
		infos, err := a.List("alloc/data")
		if err != nil || len(infos) == 0 {
			t.Fatalf("List: got %d entries, %v", len(infos), err)
		}
		wantKeys(t, infos[0], "FileMode", "IsDir", "ModTime", "Name", "Size")
	})
}

// wantKeys asserts the JSON object keys of v.
func wantKeys(t *testing.T, v any, want ...string) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("json.Marshal: %v", err)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("json.Unmarshal(%s): %v", b, err)
	}
	var got []string
	for k := range m {
		got = append(got, k)
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("JSON keys of %s: got %v, want %v", b, got, want)
	}
}

// unblockFIFO opens a FIFO's write side without blocking and closes it,
// which releases a reader stuck in open or read.
func unblockFIFO(p string) {
	if f, err := os.OpenFile(p, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
		f.Close()
	}
}

// testReadAt checks ReadAt: offsets, EOF, the secrets/private refusal on
// resolved paths, and non-regular files.
func testReadAt(t *testing.T, h *harness) {
	a := h.built(t, allocA, "web")
	readFixtures(t, a)
	apply(t, a.AllocDirPath(),
		symlink("web/local/x", "../secrets/token"),
		symlink("web/local/sdir", "../secrets"),
		symlink("web/local/p", "../private/vault"),
		symlink("alloc/data/s", "../../web/secrets/token"),
		symlink("web/local/abs", host(a, "web/secrets/token")),
		symlink("web/Secrets", "secrets"),
		symlink("web/local/absin", host(a, "alloc/data/a.txt")),
	)

	// Content is returned from the offset on.
	t.Run("Offset", func(t *testing.T) {
		for off, want := range map[int64]string{0: "0123456789", 3: "3456789", 9: "9", 10: ""} {
			got, err := readAt(t, a, "alloc/data/digits", off)
			if err != nil || got != want {
				t.Errorf("ReadAt(digits, %d): got (%q, %v), want (%q, nil)", off, got, err, want)
			}
		}
	})

	// An offset past the end is not an error: the reader is at EOF.
	t.Run("PastEOF", func(t *testing.T) {
		rc, err := a.ReadAt("alloc/data/digits", 100)
		if err != nil {
			t.Fatalf("ReadAt(digits, 100): got %v, want no error", err)
		}
		defer rc.Close()
		n, err := rc.Read(make([]byte, 8))
		if n != 0 || err != io.EOF {
			t.Errorf("Read past EOF: got (%d, %v), want (0, io.EOF)", n, err)
		}
	})

	// Ordinary content is readable: through an inside link (relative or
	// absolute under the alloc dir), logs, and names that merely look like
	// secrets/ outside a task's top level.
	t.Run("Readable", func(t *testing.T) {
		mustRead(t, a, "alloc/data/link", "alpha\n")
		mustRead(t, a, "web/local/absin", "alpha\n")
		mustRead(t, a, "alloc/logs/web.stdout.0", "log line\n")
		mustRead(t, a, "web/local/conf", "local conf")
		mustRead(t, a, "alloc/data/secrets/x", "not a secret")
		mustRead(t, a, "web/local/secrets/x", "not a secret either")
	})

	// Content under secrets/ and private/ is refused, however the path is
	// spelled.
	t.Run("Secrets", func(t *testing.T) {
		for p, want := range map[string]error{
			"web/secrets/token":                 allocdir.ErrSecret,
			"/web/secrets/token":                allocdir.ErrSecret,
			"web//secrets/./token":              allocdir.ErrSecret,
			"alloc/../web/secrets/token":        allocdir.ErrSecret,
			"web/local/../secrets/token":        allocdir.ErrSecret,
			"web/private/vault":                 allocdir.ErrPrivate,
			"web/local/../../web/private/vault": allocdir.ErrPrivate,
		} {
			got, err := readAt(t, a, p, 0)
			if !errors.Is(err, want) {
				t.Errorf("ReadAt(%s): got (%q, %v), want an error wrapping %v", p, got, err, want)
			}
		}
	})

	// The rule applies to the resolved path: a link from local/ or alloc/
	// into secrets/ or private/ is refused (nomad#28468).
	t.Run("SecretsViaLink", func(t *testing.T) {
		for p, want := range map[string]error{
			"web/local/x":          allocdir.ErrSecret,
			"web/local/sdir/token": allocdir.ErrSecret,
			"web/local/p":          allocdir.ErrPrivate,
			"alloc/data/s":         allocdir.ErrSecret,
			"web/Secrets/token":    allocdir.ErrSecret,
		} {
			got, err := readAt(t, a, p, 0)
			if !errors.Is(err, want) {
				t.Errorf("ReadAt(%s): got (%q, %v), want an error wrapping %v", p, got, err, want)
			}
		}
		// An absolute link to the host path of a secret is either followed
		// inside the allocation (and refused as secret) or an escape.
		got, err := readAt(t, a, "web/local/abs", 0)
		if !errors.Is(err, allocdir.ErrSecret) && !errors.Is(err, allocdir.ErrEscapes) {
			t.Errorf("ReadAt(web/local/abs): got (%q, %v), want an error wrapping ErrSecret or ErrEscapes", got, err)
		}
	})

	// Case variants of secrets/ never give secret content: they are
	// refused or do not exist.
	t.Run("CaseVariants", func(t *testing.T) {
		for _, p := range []string{"web/SECRETS/token", "web/sEcReTs/token", "WEB/secrets/token", "web/PRIVATE/vault"} {
			got, err := readAt(t, a, p, 0)
			if err == nil {
				t.Errorf("ReadAt(%s): got %q, want an error", p, got)
				continue
			}
			if !errors.Is(err, allocdir.ErrSecret) && !errors.Is(err, allocdir.ErrPrivate) && !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("ReadAt(%s): got %v, want ErrSecret, ErrPrivate or fs.ErrNotExist", p, err)
			}
		}
	})

	// Reading a FIFO fails promptly instead of waiting for a writer.
	t.Run("FIFO", func(t *testing.T) {
		var got string
		var err error
		if !within(hangTimeout, func() { got, err = readAt(t, a, "alloc/data/fifo", 0) }) {
			unblockFIFO(host(a, "alloc/data/fifo"))
			t.Fatalf("ReadAt(fifo) still blocked after %v", hangTimeout)
		}
		if err == nil {
			t.Errorf("ReadAt(fifo): got %q, want an error", got)
		}
	})

	// A directory has no content: an error from ReadAt or from reading.
	t.Run("Directory", func(t *testing.T) {
		if got, err := readAt(t, a, "alloc/data/dir", 0); err == nil {
			t.Errorf("ReadAt(a directory): got %q, want an error", got)
		}
	})

	// A missing file is fs.ErrNotExist.
	t.Run("NotExist", func(t *testing.T) {
		if got, err := readAt(t, a, "alloc/data/missing", 0); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("ReadAt(missing): got (%q, %v), want an error wrapping fs.ErrNotExist", got, err)
		}
	})
}
