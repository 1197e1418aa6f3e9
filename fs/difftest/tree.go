package difftest

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"golang.org/x/sys/unix"
)

// Entry is what a snapshot records of one name in a tree.
type Entry struct {
	Attr
	Ino          uint64
	Mtime, Ctime int64
	Content      string // sha256 of a regular file's data
	Target       string // a symlink's target
	Xattrs       string // name=value pairs, sorted, trusted.overlay.* left out
	LinkGroup    string // the other names of the same inode, sorted
	// Children are a directory's names, sorted.
	Children []string
	// read is set when this snapshot read the entry's data, xattrs or
	// listing rather than reusing the previous snapshot's.
	read bool
	// Err is what failed while reading the entry: a name that lists but
	// does not stat or open is a divergence, not a failure of the test.
	Err string
}

// Tree is a snapshot: every name under a root ("." for the root itself).
type Tree map[string]*Entry

// Snapshot records the tree under the directory open at root. Data is
// read again only for files whose inode, size, mtime or ctime changed
// since prev (nil for the first snapshot). It returns, besides the tree,
// the names whose mtime or ctime changed while the snapshot read them:
// reading and listing must change neither, and the tree records the
// times as they were after reading, so that the next comparison of
// changed-or-not times starts from what the reading left.
func Snapshot(root int, prev Tree) (Tree, []string) {
	t := Tree{}
	t.walk(root, ".", prev)
	var touched []string
	for rel, e := range t {
		var st unix.Stat_t
		if e.Err != "" || !e.read || unix.Fstatat(root, rel, &st, unix.AT_SYMLINK_NOFOLLOW) != nil {
			continue
		}
		m, c := unix.TimespecToNsec(st.Mtim), unix.TimespecToNsec(st.Ctim)
		if m != e.Mtime || c != e.Ctime {
			touched = append(touched, rel)
			e.Mtime, e.Ctime = m, c
		}
	}
	sort.Strings(touched)
	groups := map[uint64][]string{}
	for rel, e := range t {
		if e.Type != "dir" {
			groups[e.Ino] = append(groups[e.Ino], rel)
		}
	}
	for _, g := range groups {
		sort.Strings(g)
		for _, rel := range g {
			var others []string
			for _, o := range g {
				if o != rel {
					others = append(others, o)
				}
			}
			t[rel].LinkGroup = strings.Join(others, " ")
		}
	}
	return t, touched
}

func (t Tree) walk(root int, rel string, prev Tree) {
	var st unix.Stat_t
	if err := unix.Fstatat(root, rel, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		t[rel] = &Entry{Attr: Attr{Type: "unstatable"}, Err: "stat: " + errnoName(err)}
		return
	}
	e := &Entry{Attr: *attrOf(&st), Ino: st.Ino, Mtime: unix.TimespecToNsec(st.Mtim), Ctime: unix.TimespecToNsec(st.Ctim)}
	t[rel] = e
	if e.Type == "file" && st.Size > 0 {
		// Every snapshot: a copy-up that fills a hole changes no time.
		fd, err := unix.Openat(root, rel, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != nil {
			e.Err = "open: " + errnoName(err)
			return
		}
		e.Sparse = hasHole(fd, st.Size)
		unix.Close(fd)
	}
	if p := prev[rel]; p != nil && p.Err == "" && p.Type == e.Type && p.Ino == e.Ino && p.Size == e.Size && p.Mtime == e.Mtime && p.Ctime == e.Ctime {
		// Nothing a snapshot reads changes without changing one of
		// these on the reference; if allocfs changed it without, the
		// comparison of changed-or-not times reports that.
		e.Xattrs, e.Content, e.Target, e.Children = p.Xattrs, p.Content, p.Target, p.Children
	} else {
		e.read = true
		if err := e.readData(root, rel); err != nil {
			e.Err = err.Error()
			return
		}
	}
	for _, name := range e.Children {
		child := name
		if rel != "." {
			child = rel + "/" + name
		}
		t.walk(root, child, prev)
	}
}

// readData records the entry's xattrs and its target, data or names.
func (e *Entry) readData(root int, rel string) error {
	proc := fmt.Sprintf("/proc/self/fd/%d/%s", root, rel)
	xs, err := listxattr(proc, true)
	if err != nil {
		return fmt.Errorf("listxattr: %s", errnoName(err))
	}
	var pairs []string
	for _, name := range xs {
		if strings.HasPrefix(name, "trusted.overlay.") {
			continue
		}
		buf := make([]byte, 64<<10)
		n, err := unix.Lgetxattr(proc, name, buf)
		if err != nil {
			return fmt.Errorf("getxattr %s: %s", name, errnoName(err))
		}
		pairs = append(pairs, name+"="+string(buf[:n]))
	}
	e.Xattrs = strings.Join(pairs, " ")
	switch e.Type {
	case "symlink":
		buf := make([]byte, 4096)
		n, err := unix.Readlinkat(root, rel, buf)
		if err != nil {
			return fmt.Errorf("readlink: %s", errnoName(err))
		}
		e.Target = string(buf[:n])
	case "file":
		fd, err := unix.Openat(root, rel, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open: %s", errnoName(err))
		}
		f := os.NewFile(uintptr(fd), rel)
		h := sha256.New()
		_, err = io.Copy(h, f)
		f.Close()
		if err != nil {
			return fmt.Errorf("read: %s", errnoName(err))
		}
		e.Content = hex.EncodeToString(h.Sum(nil))[:16]
	case "dir":
		names, err := readdirRaw(root, rel)
		if err != nil {
			return fmt.Errorf("list: %s", errnoName(err))
		}
		for _, n := range names {
			name := n[:strings.LastIndexByte(n, ':')]
			if name != "." && name != ".." {
				e.Children = append(e.Children, name)
			}
		}
	}
	return nil
}

// Per-step fields: they compare what one step changed, not the state,
// so they are reported every time they differ.
const (
	FieldMtimeChanged = "mtime changed"
	FieldCtimeChanged = "ctime changed"
	FieldInoChanged   = "st_ino changed"
)

// CompareTrees lists how the allocfs tree differs from the reference
// tree. prevVol and prevRef are each side's previous snapshot: mtime and
// ctime are compared as changed-or-not since then, at the same name, for
// an object that was there before on both sides.
func CompareTrees(vol, ref, prevVol, prevRef Tree) []Diff {
	paths := map[string]bool{}
	for p := range vol {
		paths[p] = true
	}
	for p := range ref {
		paths[p] = true
	}
	sorted := make([]string, 0, len(paths))
	for p := range paths {
		sorted = append(sorted, p)
	}
	sort.Strings(sorted)
	var out []Diff
	for _, p := range sorted {
		v, r := vol[p], ref[p]
		if v == nil || r == nil {
			out = append(out, Diff{Path: p, Field: "presence", Vol: presence(v), Ref: presence(r)})
			continue
		}
		add := func(field, vs, rs string) {
			out = append(out, Diff{Path: p, Field: field, Vol: vs, Ref: rs})
		}
		out = append(out, compareAttr(p, &v.Attr, &r.Attr)...)
		if v.Type != r.Type {
			continue
		}
		if v.Err != r.Err {
			add("read error", orOK(v.Err), orOK(r.Err))
		}
		if v.Content != r.Content {
			add("content", v.Content, r.Content)
		}
		if v.Target != r.Target {
			add("symlink target", v.Target, r.Target)
		}
		if v.Xattrs != r.Xattrs {
			add("xattrs", fmt.Sprintf("[%s]", v.Xattrs), fmt.Sprintf("[%s]", r.Xattrs))
		}
		if v.LinkGroup != r.LinkGroup {
			add("hard-link group", fmt.Sprintf("[%s]", v.LinkGroup), fmt.Sprintf("[%s]", r.LinkGroup))
		}
		pv, pr := prevVol[p], prevRef[p]
		if pv == nil || pr == nil || pr.Ino != r.Ino || pv.Type != v.Type {
			continue
		}
		if pv.Ino != v.Ino {
			add(FieldInoChanged, "changed", "same")
			continue
		}
		if vm, rm := v.Mtime != pv.Mtime, r.Mtime != pr.Mtime; vm != rm {
			add(FieldMtimeChanged, changed(vm), changed(rm))
		}
		if vc, rc := v.Ctime != pv.Ctime, r.Ctime != pr.Ctime; vc != rc {
			add(FieldCtimeChanged, changed(vc), changed(rc))
		}
	}
	return out
}

// StepField reports whether field compares one step's change rather than
// state.
func StepField(field string) bool {
	return field == FieldMtimeChanged || field == FieldCtimeChanged || field == FieldInoChanged
}

func presence(e *Entry) string {
	if e == nil {
		return "missing"
	}
	return "present (" + e.Type + ")"
}

func changed(b bool) string {
	if b {
		return "changed"
	}
	return "unchanged"
}
