// Command readmode measures what serving a file's reads from the daemon
// (cached I/O: the kernel's page cache in front of FUSE READ) costs
// against passthrough, on a go-fuse loopback of a directory. See
// ../README.md.
//
//	readmode serve [-debug] -mode passthrough|cached DIR MOUNTPOINT
//	readmode randread FILE COUNT    COUNT random aligned 4 KiB preads
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"math/rand/v2"
	"os"
	"os/signal"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

func main() {
	if len(os.Args) < 2 {
		log.Fatal("usage: readmode serve -mode passthrough|cached DIR MOUNTPOINT | randread FILE COUNT")
	}
	var err error
	switch os.Args[1] {
	case "serve":
		err = serve(os.Args[2:])
	case "randread":
		err = randread(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		log.Fatal(err)
	}
}

// cachedNode is a loopback node whose opened files offer no passthrough
// fd, so the kernel serves reads from its page cache and sends misses to
// the daemon.
type cachedNode struct {
	*gofs.LoopbackNode
}

var _ = (gofs.NodeWrapChilder)((*cachedNode)(nil))

func (n *cachedNode) WrapChild(ctx context.Context, ops gofs.InodeEmbedder) gofs.InodeEmbedder {
	if lb, ok := ops.(*gofs.LoopbackNode); ok {
		return &cachedNode{lb}
	}
	return ops
}

var _ = (gofs.NodeOpener)((*cachedNode)(nil))

func (n *cachedNode) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	fh, _, errno := n.LoopbackNode.Open(ctx, flags)
	if errno != 0 {
		return nil, 0, errno
	}
	return &cachedFile{fh.(*gofs.LoopbackFile)}, fuse.FOPEN_KEEP_CACHE, 0
}

// cachedFile hides LoopbackFile's PassthroughFd.
type cachedFile struct{ f *gofs.LoopbackFile }

var _ = (gofs.FileReader)((*cachedFile)(nil))

func (c *cachedFile) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	return c.f.Read(ctx, dest, off)
}

var _ = (gofs.FileReleaser)((*cachedFile)(nil))

func (c *cachedFile) Release(ctx context.Context) syscall.Errno { return c.f.Release(ctx) }

var _ = (gofs.FileGetattrer)((*cachedFile)(nil))

func (c *cachedFile) Getattr(ctx context.Context, out *fuse.AttrOut) syscall.Errno {
	return c.f.Getattr(ctx, out)
}

func serve(args []string) error {
	fl := flag.NewFlagSet("serve", flag.ExitOnError)
	mode := fl.String("mode", "passthrough", "passthrough or cached")
	debug := fl.Bool("debug", false, "log every FUSE request (to count what reaches the daemon)")
	if err := fl.Parse(args); err != nil {
		return err
	}
	if fl.NArg() != 2 {
		return fmt.Errorf("usage: serve -mode M DIR MOUNTPOINT")
	}
	root, err := gofs.NewLoopbackRoot(fl.Arg(0))
	if err != nil {
		return err
	}
	if *mode == "cached" {
		root = &cachedNode{root.(*gofs.LoopbackNode)}
	} else if *mode != "passthrough" {
		return fmt.Errorf("unknown mode %q", *mode)
	}
	to := time.Hour
	srv, err := gofs.Mount(fl.Arg(1), root, &gofs.Options{
		EntryTimeout: &to, AttrTimeout: &to,
		MountOptions: fuse.MountOptions{FsName: "readmode", MaxWrite: 1 << 20, MaxReadAhead: 1 << 20, Debug: *debug},
	})
	if err != nil {
		return err
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	<-sig
	return srv.Unmount()
}

func randread(args []string) error {
	if len(args) != 2 {
		return fmt.Errorf("usage: randread FILE COUNT")
	}
	var n int
	if _, err := fmt.Sscan(args[1], &n); err != nil {
		return err
	}
	f, err := os.Open(args[0])
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	blocks := st.Size() / 4096
	buf := make([]byte, 4096)
	r := rand.New(rand.NewPCG(1, 2))
	t := time.Now()
	for range n {
		if _, err := f.ReadAt(buf, r.Int64N(blocks)*4096); err != nil {
			return err
		}
	}
	el := time.Since(t)
	fmt.Printf("randread %s n=%d %.0f reads/s\n", args[0], n, float64(n)/el.Seconds())
	return nil
}
