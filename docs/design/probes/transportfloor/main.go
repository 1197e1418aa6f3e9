// Command transportfloor measures what one FUSE request costs on this
// machine when the server does nothing but answer: served by go-fuse's
// fuse.Server (-mode gofuse) or by a minimal loop that handles each request
// on the goroutine that read it (-mode block), or that polls the device
// for a while before it sleeps (-mode spin). The tree is -n empty files in
// the root, in memory. "transportfloor client" stats or creates names in
// the mount from a separate process.
//
//	transportfloor -mnt DIR -mode block &
//	sync; echo 3 > /proc/sys/vm/drop_caches
//	transportfloor client -dir DIR -op stat
//	transportfloor client -dir DIR -op create -n 3000
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

var (
	mnt     = flag.String("mnt", "", "mountpoint")
	n       = flag.Int("n", 10000, "files")
	mode    = flag.String("mode", "block", "gofuse|block|spin")
	spin    = flag.Duration("spin", 50*time.Microsecond, "poll this long before sleeping (spin mode)")
	threads = flag.Int("threads", 1, "reader threads (own loop)")
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "client" {
		client(os.Args[2:])
		return
	}
	flag.Parse()
	if *mode == "gofuse" {
		serveGoFuse()
		return
	}
	serveOwn()
}

// ---- go-fuse, fs API, nodes in memory ----

type memRoot struct{ gofs.Inode }

func (r *memRoot) OnAdd(ctx context.Context) {
	for i := 0; i < *n; i++ {
		ch := r.NewPersistentInode(ctx, &gofs.MemRegularFile{Attr: fuse.Attr{Mode: 0o644}}, gofs.StableAttr{Ino: uint64(i + 2)})
		r.AddChild(fmt.Sprintf("f%05d", i), ch, false)
	}
}

func (r *memRoot) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	ch := r.NewPersistentInode(ctx, &gofs.MemRegularFile{Attr: fuse.Attr{Mode: mode}}, gofs.StableAttr{})
	out.Mode = mode | syscall.S_IFREG
	return ch, nil, fuse.FOPEN_KEEP_CACHE, 0
}

func serveGoFuse() {
	long := time.Hour
	srv, err := gofs.Mount(*mnt, &memRoot{}, &gofs.Options{EntryTimeout: &long, AttrTimeout: &long, MountOptions: fuse.MountOptions{FsName: "floor", Name: "floor", DirectMount: true}})
	if err != nil {
		panic(err)
	}
	wait()
	srv.Unmount()
}

func wait() {
	fmt.Println("ready")
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGINT, syscall.SIGTERM)
	<-c
}

// ---- own loop ----

type server struct {
	fd    int
	mu    sync.Mutex
	names map[string]uint64
	next  uint64
}

func serveOwn() {
	fd, err := unix.Open("/dev/fuse", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		panic(err)
	}
	opts := fmt.Sprintf("fd=%d,rootmode=40000,user_id=0,group_id=0,default_permissions,allow_other", fd)
	if err := unix.Mount("floor", *mnt, "fuse.floor", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		panic(err)
	}
	s := &server{fd: fd, names: map[string]uint64{}, next: uint64(*n) + 2}
	for i := 0; i < *n; i++ {
		s.names[fmt.Sprintf("f%05d", i)] = uint64(i + 2)
	}
	if *mode == "spin" {
		if err := unix.SetNonblock(fd, true); err != nil {
			panic(err)
		}
	}
	for i := 0; i < *threads; i++ {
		go s.loop()
	}
	wait()
	unix.Unmount(*mnt, unix.MNT_DETACH)
}

func (s *server) read(buf []byte) (int, error) {
	if *mode != "spin" {
		for {
			n, err := unix.Read(s.fd, buf)
			if err == unix.EINTR {
				continue
			}
			return n, err
		}
	}
	deadline := time.Now().Add(*spin)
	for i := 0; ; i++ {
		n, err := unix.Read(s.fd, buf)
		switch err {
		case nil:
			return n, nil
		case unix.EAGAIN, unix.EINTR:
		default:
			return 0, err
		}
		if i&15 == 15 && time.Now().After(deadline) {
			pfd := []unix.PollFd{{Fd: int32(s.fd), Events: unix.POLLIN}}
			if _, err := unix.Poll(pfd, -1); err != nil && err != unix.EINTR {
				return 0, err
			}
			deadline = time.Now().Add(*spin)
		}
	}
}

func (s *server) loop() {
	runtime.LockOSThread()
	buf := make([]byte, 1<<20+4096)
	out := make([]byte, 4096)
	for {
		nr, err := s.read(buf)
		if err != nil {
			if err == unix.ENODEV {
				os.Exit(0)
			}
			panic(err)
		}
		in := (*fuse.InHeader)(unsafe.Pointer(&buf[0]))
		body := buf[unsafe.Sizeof(fuse.InHeader{}):nr]
		size, errno, reply := s.handle(in, body, out[16:])
		if !reply {
			continue
		}
		oh := (*fuse.OutHeader)(unsafe.Pointer(&out[0]))
		oh.Unique = in.Unique
		oh.Status = -int32(errno)
		if errno != 0 {
			size = 0
		}
		oh.Length = uint32(16 + size)
		if _, err := unix.Write(s.fd, out[:oh.Length]); err != nil && err != unix.ENOENT {
			fmt.Fprintln(os.Stderr, "write:", err)
		}
	}
}

const (
	opLookup      = 1
	opForget      = 2
	opGetattr     = 3
	opOpen        = 14
	opRelease     = 18
	opStatfs      = 17
	opGetxattr    = 22
	opFlush       = 25
	opInit        = 26
	opOpendir     = 27
	opReleasedir  = 29
	opInterrupt   = 36
	opCreate      = 35
	opDestroy     = 38
	opBatchForget = 42
)

func cstr(b []byte) string {
	if i := strings.IndexByte(string(b), 0); i >= 0 {
		return string(b[:i])
	}
	return string(b)
}

func attr(a *fuse.Attr, ino uint64) {
	a.Ino = ino
	a.Nlink = 1
	if ino == 1 {
		a.Mode = syscall.S_IFDIR | 0o755
		a.Nlink = 2
	} else {
		a.Mode = syscall.S_IFREG | 0o644
	}
}

func (s *server) handle(in *fuse.InHeader, body, out []byte) (int, syscall.Errno, bool) {
	switch in.Opcode {
	case opInit:
		ii := (*fuse.InitIn)(unsafe.Pointer(uintptr(unsafe.Pointer(&body[0])) - unsafe.Sizeof(fuse.InHeader{})))
		io := (*fuse.InitOut)(unsafe.Pointer(&out[0]))
		*io = fuse.InitOut{Major: 7, Minor: ii.Minor, MaxReadAhead: ii.MaxReadAhead, MaxWrite: 128 << 10, MaxBackground: 12, CongestionThreshold: 9, TimeGran: 1, MaxPages: 32}
		if io.Minor > 41 {
			io.Minor = 41
		}
		want := uint64(fuse.CAP_ASYNC_READ | fuse.CAP_BIG_WRITES | fuse.CAP_PARALLEL_DIROPS | fuse.CAP_MAX_PAGES)
		f := ii.Flags64() & want
		io.Flags, io.Flags2 = uint32(f), uint32(f>>32)
		return int(unsafe.Sizeof(fuse.InitOut{})), 0, true
	case opLookup:
		name := cstr(body)
		s.mu.Lock()
		ino, ok := s.names[name]
		s.mu.Unlock()
		if !ok {
			return 0, syscall.ENOENT, true
		}
		eo := (*fuse.EntryOut)(unsafe.Pointer(&out[0]))
		*eo = fuse.EntryOut{NodeId: ino, EntryValid: 3600, AttrValid: 3600}
		attr(&eo.Attr, ino)
		return int(unsafe.Sizeof(fuse.EntryOut{})), 0, true
	case opGetattr:
		ao := (*fuse.AttrOut)(unsafe.Pointer(&out[0]))
		*ao = fuse.AttrOut{AttrValid: 3600}
		attr(&ao.Attr, in.NodeId)
		return int(unsafe.Sizeof(fuse.AttrOut{})), 0, true
	case opCreate:
		// CreateIn: flags, mode, umask, open_flags (16 bytes), then the name.
		name := cstr(body[16:])
		s.mu.Lock()
		ino := s.next
		s.next++
		s.names[name] = ino
		s.mu.Unlock()
		eo := (*fuse.EntryOut)(unsafe.Pointer(&out[0]))
		*eo = fuse.EntryOut{NodeId: ino, EntryValid: 3600, AttrValid: 3600}
		attr(&eo.Attr, ino)
		oo := (*fuse.OpenOut)(unsafe.Pointer(&out[unsafe.Sizeof(fuse.EntryOut{})]))
		*oo = fuse.OpenOut{Fh: 1, OpenFlags: fuse.FOPEN_KEEP_CACHE}
		return int(unsafe.Sizeof(fuse.EntryOut{}) + unsafe.Sizeof(fuse.OpenOut{})), 0, true
	case opOpen, opOpendir:
		oo := (*fuse.OpenOut)(unsafe.Pointer(&out[0]))
		*oo = fuse.OpenOut{Fh: 1}
		return int(unsafe.Sizeof(fuse.OpenOut{})), 0, true
	case opRelease, opReleasedir, opFlush:
		return 0, 0, true
	case opGetxattr:
		return 0, syscall.ENODATA, true
	case opForget, opBatchForget, opInterrupt:
		return 0, 0, false
	case opDestroy:
		return 0, 0, true
	}
	return 0, syscall.ENOSYS, true
}

func client(args []string) {
	fl := flag.NewFlagSet("client", flag.ExitOnError)
	dir := fl.String("dir", "", "the mount")
	n := fl.Int("n", 10000, "names")
	op := fl.String("op", "stat", "stat|create")
	fl.Parse(args)
	var st unix.Stat_t
	start := time.Now()
	for i := 0; i < *n; i++ {
		p := filepath.Join(*dir, fmt.Sprintf("f%05d", i))
		switch *op {
		case "stat":
			if err := unix.Lstat(p, &st); err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
		case "create":
			fd, err := unix.Open(p+"c", unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY, 0o644)
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
			unix.Close(fd)
		}
	}
	el := time.Since(start)
	fmt.Printf("%s %d in %v: %.0f/s\n", *op, *n, el, float64(*n)/el.Seconds())
}
