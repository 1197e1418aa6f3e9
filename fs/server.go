package fs

import (
	"fmt"
	"os"
	"time"

	"github.com/allocfs/allocfs/fs/killpriv"
	"github.com/allocfs/allocfs/restart"
	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// mountCapabilities are the INIT flags the mount asks for: what go-fuse's
// server negotiates for the node bridge (asynchronous and large reads and
// writes, READDIRPLUS, parallel lookups in one directory, renameat2
// flags, passthrough, the kernel invalidating cached data when a file's
// mtime or size changes), READDIRPLUS_AUTO (mount.go, volume/plusbatch.go) and
// HANDLE_KILLPRIV_V2 (fs/killpriv).
const mountCapabilities = fuse.CAP_ASYNC_READ | fuse.CAP_BIG_WRITES | fuse.CAP_FILE_OPS |
	fuse.CAP_READDIRPLUS | fuse.CAP_READDIRPLUS_AUTO | fuse.CAP_PARALLEL_DIROPS | fuse.CAP_MAX_PAGES |
	fuse.CAP_RENAME_SWAP | fuse.CAP_PASSTHROUGH | fuse.CAP_AUTO_INVAL_DATA | capHandleKillprivV2

// newHandler makes what serves the mount's requests: the node tree behind
// go-fuse's bridge, with the write flags passed on (killpriv.Flags), the
// attributes a SETATTR answers cached (setattrTimeout), the release
// ordering around it.
// A daemon of a later generation than 0 took the connection over, and
// resolves what the kernel got from earlier ones (takeover.go); one whose
// connection can be taken over records the outcome of namespace requests
// (outcomes.go), for the next.
func (m *Mount) newHandler(fopts *gofs.Options, generation uint32, takeable bool) fuse.RawFileSystem {
	var h fuse.RawFileSystem = &releaseOrder{RawFileSystem: setattrTimeout{killpriv.Flags{RawFileSystem: gofs.NewNodeFS(m.root, fopts)}, m.opts.StableTimeout}}
	if generation > 0 {
		m.takeover = restart.NewTakeoverFS(h, m.logger.Named("takeover"), generation, m.pathsOfNode)
		m.takeover.Found = func(path []string) { unnameUnlinked(m.root.EmbeddedInode(), path) }
		m.takeover.Forgotten = func(id uint64) { restart.NewUnlinked(m.store.DataDir()).Remove(id) }
		h = m.takeover
	}
	if takeable {
		o, err := restart.OpenOutcomes(h, m.store.DataDir(), generation > 0)
		if err != nil {
			m.logger.Error("a daemon taking this mount over will run again what this one did not answer", "error", err)
		} else {
			m.outcomes = o
			h = o
		}
	}
	if m.opts.interpose != nil {
		h = m.opts.interpose(h)
	}
	return h
}

// serveGoFuse mounts and serves with go-fuse's server.
func (m *Mount) serveGoFuse(dir string, fopts *gofs.Options) error {
	server, err := fuse.NewServer(m.newHandler(fopts, 0, false), dir, &fopts.MountOptions)
	if err != nil {
		return fmt.Errorf("failed to mount allocfs at %q: %w", dir, err)
	}
	go server.Serve()
	m.server = goFuseServer{server}
	if err := server.WaitMount(); err != nil {
		return fmt.Errorf("mount at %q did not come up: %w", dir, err)
	}
	m.vol.SetPassthrough(os.Geteuid() == 0 && server.KernelSettings().Flags64()&fuse.CAP_PASSTHROUGH != 0)
	return nil
}

// setattrTimeout has the kernel cache the attributes a SETATTR answers
// for as long as those a GETATTR or a LOOKUP answers: go-fuse's bridge
// leaves their timeout at 0, so every chmod or chown would cost the next
// stat of the file a GETATTR. The change went through the kernel, which
// keeps what it caches right, as for every other change.
type setattrTimeout struct {
	fuse.RawFileSystem
	timeout time.Duration
}

func (s setattrTimeout) SetAttr(cancel <-chan struct{}, in *fuse.SetAttrIn, out *fuse.AttrOut) fuse.Status {
	st := s.RawFileSystem.SetAttr(cancel, in, out)
	if st == fuse.OK && out.Timeout() == 0 {
		out.SetTimeout(s.timeout)
	}
	return st
}
