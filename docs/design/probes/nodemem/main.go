// Command nodemem measures what a FUSE server holds per node the kernel
// caches. It serves a synthetic tree of -dirs directories of -files empty
// files each, in one of three ways:
//
//	inode   go-fuse's fs.Inode tree, one node struct per looked-up entry
//	raw     fuse.RawFileSystem with no per-node state: the node ID is
//	        computed from (directory, file) and LOOKUP decodes it
//	rawmap  as raw, plus one map entry per node the kernel holds
//	        (generation and lookup count), dropped on FORGET
//
// On SIGUSR1 it runs a GC and prints the Go heap and its own VmRSS and
// VmHWM; on SIGINT or SIGTERM it unmounts. See ../README.md.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

var (
	nDirs  = flag.Int("dirs", 1000, "directories under the root")
	nFiles = flag.Int("files", 1000, "empty files in each directory")
	mode   = flag.String("mode", "raw", "inode, raw or rawmap")
)

const timeout = time.Hour

func main() {
	flag.Parse()
	if flag.NArg() != 1 {
		log.Fatal("usage: nodemem [-mode inode|raw|rawmap] [-dirs N] [-files N] MOUNTPOINT")
	}
	mnt := flag.Arg(0)
	opts := fuse.MountOptions{FsName: "nodemem", Name: "nodemem", MaxBackground: 64}
	var (
		srv *fuse.Server
		err error
		tbl *table
	)
	switch *mode {
	case "inode":
		to := timeout
		srv, err = gofs.Mount(mnt, &dirNode{dir: -1}, &gofs.Options{MountOptions: opts, EntryTimeout: &to, AttrTimeout: &to})
	case "raw", "rawmap":
		r := &rawFS{RawFileSystem: fuse.NewDefaultRawFileSystem()}
		if *mode == "rawmap" {
			tbl = &table{m: make(map[uint64]rec)}
			r.tbl = tbl
		}
		srv, err = fuse.NewServer(r, mnt, &opts)
		if err == nil {
			go srv.Serve()
			err = srv.WaitMount()
		}
	default:
		log.Fatalf("unknown mode %q", *mode)
	}
	if err != nil {
		log.Fatalf("mount: %v", err)
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGUSR1, syscall.SIGINT, syscall.SIGTERM)
	for s := range sig {
		if s != syscall.SIGUSR1 {
			break
		}
		report(tbl)
	}
	if err := srv.Unmount(); err != nil {
		log.Fatalf("unmount: %v", err)
	}
}

func report(tbl *table) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	entries := -1
	if tbl != nil {
		tbl.mu.Lock()
		entries = len(tbl.m)
		tbl.mu.Unlock()
	}
	fmt.Printf("mode=%s heap_inuse=%d heap_alloc=%d sys=%d %s table=%d\n",
		*mode, ms.HeapInuse, ms.HeapAlloc, ms.Sys, procStatus("VmRSS", "VmHWM"), entries)
}

func procStatus(keys ...string) string {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		for _, k := range keys {
			if v, ok := strings.CutPrefix(sc.Text(), k+":"); ok {
				out = append(out, k+"="+strings.Join(strings.Fields(v), ""))
			}
		}
	}
	return strings.Join(out, " ")
}

func dirName(d int) string  { return fmt.Sprintf("d%04d", d) }
func fileName(f int) string { return fmt.Sprintf("f%04d", f) }

// parse returns the index in "d0042" or "f0042" for prefix 'd' or 'f'.
func parse(name string, prefix byte, n int) (int, bool) {
	if len(name) != 5 || name[0] != prefix {
		return 0, false
	}
	i := 0
	for _, c := range name[1:] {
		if c < '0' || c > '9' {
			return 0, false
		}
		i = i*10 + int(c-'0')
	}
	return i, i < n
}

// --- go-fuse fs.Inode tree ---

// dirNode is the root (dir -1) or one directory; fileNode one file. The
// structs are as small as a real server's could be: the Inode plus the
// identity of the entry.
type dirNode struct {
	gofs.Inode
	dir int32
}

type fileNode struct {
	gofs.Inode
	dir, file int32
}

var _ = (gofs.NodeLookuper)((*dirNode)(nil))

func (n *dirNode) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if n.dir < 0 {
		d, ok := parse(name, 'd', *nDirs)
		if !ok {
			return nil, syscall.ENOENT
		}
		fillAttr(&out.Attr, dirID(d), true)
		return n.NewInode(ctx, &dirNode{dir: int32(d)}, gofs.StableAttr{Mode: syscall.S_IFDIR, Ino: dirID(d)}), 0
	}
	f, ok := parse(name, 'f', *nFiles)
	if !ok {
		return nil, syscall.ENOENT
	}
	id := fileID(int(n.dir), f)
	fillAttr(&out.Attr, id, false)
	return n.NewInode(ctx, &fileNode{dir: n.dir, file: int32(f)}, gofs.StableAttr{Mode: syscall.S_IFREG, Ino: id}), 0
}

var _ = (gofs.NodeReaddirer)((*dirNode)(nil))

func (n *dirNode) Readdir(ctx context.Context) (gofs.DirStream, syscall.Errno) {
	var es []fuse.DirEntry
	if n.dir < 0 {
		for d := range *nDirs {
			es = append(es, fuse.DirEntry{Name: dirName(d), Mode: syscall.S_IFDIR, Ino: dirID(d)})
		}
	} else {
		for f := range *nFiles {
			es = append(es, fuse.DirEntry{Name: fileName(f), Mode: syscall.S_IFREG, Ino: fileID(int(n.dir), f)})
		}
	}
	return gofs.NewListDirStream(es), 0
}

var _ = (gofs.NodeGetattrer)((*dirNode)(nil))

func (n *dirNode) Getattr(ctx context.Context, f gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	id := uint64(1)
	if n.dir >= 0 {
		id = dirID(int(n.dir))
	}
	fillAttr(&out.Attr, id, true)
	out.SetTimeout(timeout)
	return 0
}

var _ = (gofs.NodeGetattrer)((*fileNode)(nil))

func (n *fileNode) Getattr(ctx context.Context, f gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	fillAttr(&out.Attr, fileID(int(n.dir), int(n.file)), false)
	out.SetTimeout(timeout)
	return 0
}

// --- raw server, node IDs computed ---

// Node IDs: 1 is the root, (d+1)<<32 directory d, (d+1)<<32|(f+1) file f
// of directory d. Decoding one is the whole lookup.
func dirID(d int) uint64     { return uint64(d+1) << 32 }
func fileID(d, f int) uint64 { return uint64(d+1)<<32 | uint64(f+1) }

func decode(id uint64) (d, f int, ok bool) {
	if id == 1 {
		return -1, -1, true
	}
	d, f = int(id>>32)-1, int(id&0xffffffff)-1
	return d, f, d >= 0 && d < *nDirs && f < *nFiles
}

func fillAttr(a *fuse.Attr, id uint64, dir bool) {
	a.Ino = id
	a.Mode = syscall.S_IFREG | 0o644
	a.Nlink = 1
	if dir {
		a.Mode = syscall.S_IFDIR | 0o755
		a.Nlink = 2
	}
}

type rec struct{ gen, nlookup uint32 }

// table is the smallest per-node state a server can keep: what it needs
// to check a generation and to know when the kernel forgot a node.
type table struct {
	mu sync.Mutex
	m  map[uint64]rec
}

func (t *table) ref(id uint64) {
	if t == nil {
		return
	}
	t.mu.Lock()
	r := t.m[id]
	if r.nlookup == 0 {
		// A real server records the backing inode's generation here;
		// the synthetic tree has none, and only the size matters.
		r.gen = 1
	}
	r.nlookup++
	t.m[id] = r
	t.mu.Unlock()
}

type rawFS struct {
	fuse.RawFileSystem
	tbl *table
}

func (r *rawFS) entry(parent uint64, name string, out *fuse.EntryOut) fuse.Status {
	d, f, ok := decode(parent)
	if !ok || f >= 0 {
		return fuse.ENOENT
	}
	var id uint64
	if d < 0 {
		dd, ok := parse(name, 'd', *nDirs)
		if !ok {
			return fuse.ENOENT
		}
		id = dirID(dd)
	} else {
		ff, ok := parse(name, 'f', *nFiles)
		if !ok {
			return fuse.ENOENT
		}
		id = fileID(d, ff)
	}
	out.NodeId = id
	fillAttr(&out.Attr, id, d < 0)
	out.SetEntryTimeout(timeout)
	out.SetAttrTimeout(timeout)
	r.tbl.ref(id)
	return fuse.OK
}

func (r *rawFS) Lookup(cancel <-chan struct{}, h *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	return r.entry(h.NodeId, name, out)
}

func (r *rawFS) Forget(id, nlookup uint64) {
	if r.tbl == nil {
		return
	}
	r.tbl.mu.Lock()
	defer r.tbl.mu.Unlock()
	if rc := r.tbl.m[id]; uint64(rc.nlookup) <= nlookup {
		delete(r.tbl.m, id)
	} else {
		rc.nlookup -= uint32(nlookup)
		r.tbl.m[id] = rc
	}
}

func (r *rawFS) GetAttr(cancel <-chan struct{}, in *fuse.GetAttrIn, out *fuse.AttrOut) fuse.Status {
	d, f, ok := decode(in.NodeId)
	if !ok {
		return fuse.Status(syscall.ESTALE)
	}
	fillAttr(&out.Attr, in.NodeId, f < 0 || d < 0)
	out.SetTimeout(timeout)
	return fuse.OK
}

func (r *rawFS) OpenDir(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	if _, f, ok := decode(in.NodeId); !ok || f >= 0 {
		return fuse.ENOTDIR
	}
	out.OpenFlags = fuse.FOPEN_KEEP_CACHE | fuse.FOPEN_CACHE_DIR
	return fuse.OK
}

func (r *rawFS) ReleaseDir(in *fuse.ReleaseIn) {}

func (r *rawFS) list(in *fuse.ReadIn, out *fuse.DirEntryList, plus bool) fuse.Status {
	d, _, _ := decode(in.NodeId)
	n, mode := *nFiles, uint32(syscall.S_IFREG)
	if d < 0 {
		n, mode = *nDirs, syscall.S_IFDIR
	}
	for i := int(in.Offset); i < n; i++ {
		name, id := fileName(i), uint64(0)
		if d < 0 {
			name, id = dirName(i), dirID(i)
		} else {
			id = fileID(d, i)
		}
		e := fuse.DirEntry{Name: name, Mode: mode, Ino: id, Off: uint64(i + 1)}
		if !plus {
			if !out.AddDirEntry(e) {
				break
			}
			continue
		}
		eo := out.AddDirLookupEntry(e)
		if eo == nil {
			break
		}
		if st := r.entry(in.NodeId, name, eo); st != fuse.OK {
			return st
		}
	}
	return fuse.OK
}

func (r *rawFS) ReadDir(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	return r.list(in, out, false)
}

func (r *rawFS) ReadDirPlus(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	return r.list(in, out, true)
}

func (r *rawFS) StatFs(cancel <-chan struct{}, in *fuse.InHeader, out *fuse.StatfsOut) fuse.Status {
	out.NameLen = 255
	return fuse.OK
}
