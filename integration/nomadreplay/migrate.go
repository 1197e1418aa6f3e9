package nomadreplay

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// Snapshot writes what the previous node's client streams for a remote
// migration: a tar of alloc/data and each task's local/ of allocation
// dir, names relative to it.
func Snapshot(w io.Writer, dir string, tasks []string) error {
	tw := tar.NewWriter(w)
	roots := []string{"alloc/data"}
	for _, task := range tasks {
		roots = append(roots, filepath.Join(task, "local"))
	}
	for _, root := range roots {
		err := filepath.WalkDir(filepath.Join(dir, root), func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			fi, err := d.Info()
			if err != nil {
				return err
			}
			link := ""
			if fi.Mode()&os.ModeSymlink != 0 {
				if link, err = os.Readlink(p); err != nil {
					return err
				}
			}
			h, err := tar.FileInfoHeader(fi, link)
			if err != nil {
				return err
			}
			rel, err := filepath.Rel(dir, p)
			if err != nil {
				return err
			}
			h.Name = rel
			if fi.IsDir() {
				h.Name += "/"
			}
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				h.Uid, h.Gid = int(st.Uid), int(st.Gid)
			}
			h.Uname, h.Gname = "", ""
			if err := tw.WriteHeader(h); err != nil {
				return err
			}
			if !fi.Mode().IsRegular() {
				return nil
			}
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = io.Copy(tw, f)
			return err
		})
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("snapshot of %s: %w", root, err)
		}
	}
	return tw.Close()
}

// Receive is the new node's side of a remote migration: prevID's
// directory is built as any allocation's, and the stream unpacked into
// it entry by entry as Nomad does: directories made and chowned;
// symlinks made, then refused if they lead outside; files removed if
// there, created, chmod'ed, chowned and written 1 KiB at a time; hard
// links, FIFOs and devices skipped; no times, no xattrs. The caller then
// moves prevID into the new allocation and destroys prevID.
func (c *Client) Receive(prevID string, r io.Reader) error {
	if err := c.Build(prevID); err != nil {
		return err
	}
	dir := c.Dir(prevID)
	tr := tar.NewReader(r)
	buf := make([]byte, 1024)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("migrate: reading the snapshot: %w", err)
		}
		p := filepath.Join(dir, filepath.Clean("/"+h.Name))
		mode := os.FileMode(h.Mode).Perm()
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, mode); err != nil {
				return fmt.Errorf("migrate: %w", err)
			}
			if err := os.Chown(p, h.Uid, h.Gid); err != nil {
				return fmt.Errorf("migrate: %w", err)
			}
		case tar.TypeSymlink:
			if err := os.Symlink(h.Linkname, p); err != nil {
				return fmt.Errorf("migrate: %w", err)
			}
			target := h.Linkname
			if !filepath.IsAbs(target) {
				target = filepath.Join(filepath.Dir(p), target)
			}
			if rel, err := filepath.Rel(dir, target); err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
				return fmt.Errorf("migrate: symlink %s escapes the allocation directory", h.Name)
			}
		case tar.TypeReg:
			if _, err := os.Lstat(p); err == nil {
				if err := os.Remove(p); err != nil {
					return fmt.Errorf("migrate: %w", err)
				}
			}
			f, err := os.Create(p)
			if err != nil {
				return fmt.Errorf("migrate: %w", err)
			}
			err = f.Chmod(mode)
			if err == nil {
				err = f.Chown(h.Uid, h.Gid)
			}
			if err == nil {
				_, err = io.CopyBuffer(onlyWriter{f}, tr, buf)
			}
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return fmt.Errorf("migrate: %s: %w", h.Name, err)
			}
		}
	}
}

// onlyWriter hides ReadFrom, so that the copy writes in its buffer's
// 1 KiB chunks as Nomad's does.
type onlyWriter struct{ w io.Writer }

func (o onlyWriter) Write(p []byte) (int, error) { return o.w.Write(p) }
