// The methods of countingFS: every method of go-fuse's
// fuse.RawFileSystem (v2.12.1), spelled out so that the compiler says when
// go-fuse adds one. Each request method counts its request and passes it
// on; the rest only pass on.

package fs

import "github.com/hanwen/go-fuse/v2/fuse"

// fuseOp numbers the requests countingFS counts.
type fuseOp int

const (
	opLookup fuseOp = iota
	opForget
	opGetAttr
	opSetAttr
	opMknod
	opMkdir
	opUnlink
	opRmdir
	opRename
	opLink
	opSymlink
	opReadlink
	opAccess
	opGetXAttr
	opListXAttr
	opSetXAttr
	opRemoveXAttr
	opCreate
	opTmpfile
	opOpen
	opRead
	opLseek
	opGetLk
	opSetLk
	opSetLkw
	opRelease
	opWrite
	opWritev
	opCopyFileRange
	opIoctl
	opFlush
	opFsync
	opFallocate
	opOpenDir
	opReadDir
	opReadDirPlus
	opReleaseDir
	opFsyncDir
	opStatFs
	opStatx
	numFuseOps
)

// fuseOpNames are the requests' names, as the protocol's opcodes read.
var fuseOpNames = [numFuseOps]string{
	opLookup:        "LOOKUP",
	opForget:        "FORGET",
	opGetAttr:       "GETATTR",
	opSetAttr:       "SETATTR",
	opMknod:         "MKNOD",
	opMkdir:         "MKDIR",
	opUnlink:        "UNLINK",
	opRmdir:         "RMDIR",
	opRename:        "RENAME",
	opLink:          "LINK",
	opSymlink:       "SYMLINK",
	opReadlink:      "READLINK",
	opAccess:        "ACCESS",
	opGetXAttr:      "GETXATTR",
	opListXAttr:     "LISTXATTR",
	opSetXAttr:      "SETXATTR",
	opRemoveXAttr:   "REMOVEXATTR",
	opCreate:        "CREATE",
	opTmpfile:       "TMPFILE",
	opOpen:          "OPEN",
	opRead:          "READ",
	opLseek:         "LSEEK",
	opGetLk:         "GETLK",
	opSetLk:         "SETLK",
	opSetLkw:        "SETLKW",
	opRelease:       "RELEASE",
	opWrite:         "WRITE",
	opWritev:        "WRITEV",
	opCopyFileRange: "COPYFILERANGE",
	opIoctl:         "IOCTL",
	opFlush:         "FLUSH",
	opFsync:         "FSYNC",
	opFallocate:     "FALLOCATE",
	opOpenDir:       "OPENDIR",
	opReadDir:       "READDIR",
	opReadDirPlus:   "READDIRPLUS",
	opReleaseDir:    "RELEASEDIR",
	opFsyncDir:      "FSYNCDIR",
	opStatFs:        "STATFS",
	opStatx:         "STATX",
}

var _ fuse.RawFileSystem = (*countingFS)(nil)

func (c *countingFS) String() string { return c.fs.String() }

func (c *countingFS) SetDebug(debug bool) { c.fs.SetDebug(debug) }

func (c *countingFS) Init(s *fuse.Server) { c.fs.Init(s) }

func (c *countingFS) OnUnmount() { c.fs.OnUnmount() }

func (c *countingFS) Lookup(cancel <-chan struct{}, header *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	c.counts[opLookup].Add(1)
	return c.fs.Lookup(cancel, header, name, out)
}

func (c *countingFS) Forget(nodeid uint64, nlookup uint64) {
	c.counts[opForget].Add(1)
	c.fs.Forget(nodeid, nlookup)
}

func (c *countingFS) GetAttr(cancel <-chan struct{}, input *fuse.GetAttrIn, out *fuse.AttrOut) fuse.Status {
	c.counts[opGetAttr].Add(1)
	return c.fs.GetAttr(cancel, input, out)
}

func (c *countingFS) SetAttr(cancel <-chan struct{}, input *fuse.SetAttrIn, out *fuse.AttrOut) fuse.Status {
	c.counts[opSetAttr].Add(1)
	return c.fs.SetAttr(cancel, input, out)
}

func (c *countingFS) Mknod(cancel <-chan struct{}, input *fuse.MknodIn, name string, out *fuse.EntryOut) fuse.Status {
	c.counts[opMknod].Add(1)
	return c.fs.Mknod(cancel, input, name, out)
}

func (c *countingFS) Mkdir(cancel <-chan struct{}, input *fuse.MkdirIn, name string, out *fuse.EntryOut) fuse.Status {
	c.counts[opMkdir].Add(1)
	return c.fs.Mkdir(cancel, input, name, out)
}

func (c *countingFS) Unlink(cancel <-chan struct{}, header *fuse.InHeader, name string) fuse.Status {
	c.counts[opUnlink].Add(1)
	return c.fs.Unlink(cancel, header, name)
}

func (c *countingFS) Rmdir(cancel <-chan struct{}, header *fuse.InHeader, name string) fuse.Status {
	c.counts[opRmdir].Add(1)
	return c.fs.Rmdir(cancel, header, name)
}

func (c *countingFS) Rename(cancel <-chan struct{}, input *fuse.RenameIn, oldName string, newName string) fuse.Status {
	c.counts[opRename].Add(1)
	return c.fs.Rename(cancel, input, oldName, newName)
}

func (c *countingFS) Link(cancel <-chan struct{}, input *fuse.LinkIn, filename string, out *fuse.EntryOut) fuse.Status {
	c.counts[opLink].Add(1)
	return c.fs.Link(cancel, input, filename, out)
}

func (c *countingFS) Symlink(cancel <-chan struct{}, header *fuse.InHeader, pointedTo string, linkName string, out *fuse.EntryOut) fuse.Status {
	c.counts[opSymlink].Add(1)
	return c.fs.Symlink(cancel, header, pointedTo, linkName, out)
}

func (c *countingFS) Readlink(cancel <-chan struct{}, header *fuse.InHeader) ([]byte, fuse.Status) {
	c.counts[opReadlink].Add(1)
	return c.fs.Readlink(cancel, header)
}

func (c *countingFS) Access(cancel <-chan struct{}, input *fuse.AccessIn) fuse.Status {
	c.counts[opAccess].Add(1)
	return c.fs.Access(cancel, input)
}

func (c *countingFS) GetXAttr(cancel <-chan struct{}, header *fuse.InHeader, attr string, dest []byte) (uint32, fuse.Status) {
	c.counts[opGetXAttr].Add(1)
	return c.fs.GetXAttr(cancel, header, attr, dest)
}

func (c *countingFS) ListXAttr(cancel <-chan struct{}, header *fuse.InHeader, dest []byte) (uint32, fuse.Status) {
	c.counts[opListXAttr].Add(1)
	return c.fs.ListXAttr(cancel, header, dest)
}

func (c *countingFS) SetXAttr(cancel <-chan struct{}, input *fuse.SetXAttrIn, attr string, data []byte) fuse.Status {
	c.counts[opSetXAttr].Add(1)
	return c.fs.SetXAttr(cancel, input, attr, data)
}

func (c *countingFS) RemoveXAttr(cancel <-chan struct{}, header *fuse.InHeader, attr string) fuse.Status {
	c.counts[opRemoveXAttr].Add(1)
	return c.fs.RemoveXAttr(cancel, header, attr)
}

func (c *countingFS) Create(cancel <-chan struct{}, input *fuse.CreateIn, name string, out *fuse.CreateOut) fuse.Status {
	c.counts[opCreate].Add(1)
	return c.fs.Create(cancel, input, name, out)
}

func (c *countingFS) Tmpfile(cancel <-chan struct{}, input *fuse.CreateIn, out *fuse.CreateOut) fuse.Status {
	c.counts[opTmpfile].Add(1)
	return c.fs.Tmpfile(cancel, input, out)
}

func (c *countingFS) Open(cancel <-chan struct{}, input *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	c.counts[opOpen].Add(1)
	return c.fs.Open(cancel, input, out)
}

func (c *countingFS) Read(cancel <-chan struct{}, input *fuse.ReadIn, buf []byte) (fuse.ReadResult, fuse.Status) {
	c.counts[opRead].Add(1)
	return c.fs.Read(cancel, input, buf)
}

func (c *countingFS) Lseek(cancel <-chan struct{}, in *fuse.LseekIn, out *fuse.LseekOut) fuse.Status {
	c.counts[opLseek].Add(1)
	return c.fs.Lseek(cancel, in, out)
}

func (c *countingFS) GetLk(cancel <-chan struct{}, input *fuse.LkIn, out *fuse.LkOut) fuse.Status {
	c.counts[opGetLk].Add(1)
	return c.fs.GetLk(cancel, input, out)
}

func (c *countingFS) SetLk(cancel <-chan struct{}, input *fuse.LkIn) fuse.Status {
	c.counts[opSetLk].Add(1)
	return c.fs.SetLk(cancel, input)
}

func (c *countingFS) SetLkw(cancel <-chan struct{}, input *fuse.LkIn) fuse.Status {
	c.counts[opSetLkw].Add(1)
	return c.fs.SetLkw(cancel, input)
}

func (c *countingFS) Release(cancel <-chan struct{}, input *fuse.ReleaseIn) {
	c.counts[opRelease].Add(1)
	c.fs.Release(cancel, input)
}

func (c *countingFS) Write(cancel <-chan struct{}, input *fuse.WriteIn, data []byte) (uint32, fuse.Status) {
	c.counts[opWrite].Add(1)
	return c.fs.Write(cancel, input, data)
}

func (c *countingFS) Writev(cancel <-chan struct{}, input *fuse.WriteIn, data [][]byte) (uint32, fuse.Status) {
	c.counts[opWritev].Add(1)
	return c.fs.Writev(cancel, input, data)
}

func (c *countingFS) CopyFileRange(cancel <-chan struct{}, input *fuse.CopyFileRangeIn) (uint32, fuse.Status) {
	c.counts[opCopyFileRange].Add(1)
	return c.fs.CopyFileRange(cancel, input)
}

func (c *countingFS) Ioctl(cancel <-chan struct{}, input *fuse.IoctlIn, inbuf []byte, output *fuse.IoctlOut, outbuf []byte) fuse.Status {
	c.counts[opIoctl].Add(1)
	return c.fs.Ioctl(cancel, input, inbuf, output, outbuf)
}

func (c *countingFS) Flush(cancel <-chan struct{}, input *fuse.FlushIn) fuse.Status {
	c.counts[opFlush].Add(1)
	return c.fs.Flush(cancel, input)
}

func (c *countingFS) Fsync(cancel <-chan struct{}, input *fuse.FsyncIn) fuse.Status {
	c.counts[opFsync].Add(1)
	return c.fs.Fsync(cancel, input)
}

func (c *countingFS) Fallocate(cancel <-chan struct{}, input *fuse.FallocateIn) fuse.Status {
	c.counts[opFallocate].Add(1)
	return c.fs.Fallocate(cancel, input)
}

func (c *countingFS) OpenDir(cancel <-chan struct{}, input *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	c.counts[opOpenDir].Add(1)
	return c.fs.OpenDir(cancel, input, out)
}

func (c *countingFS) ReadDir(cancel <-chan struct{}, input *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	c.counts[opReadDir].Add(1)
	return c.fs.ReadDir(cancel, input, out)
}

func (c *countingFS) ReadDirPlus(cancel <-chan struct{}, input *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	c.counts[opReadDirPlus].Add(1)
	return c.fs.ReadDirPlus(cancel, input, out)
}

func (c *countingFS) ReleaseDir(input *fuse.ReleaseIn) {
	c.counts[opReleaseDir].Add(1)
	c.fs.ReleaseDir(input)
}

func (c *countingFS) FsyncDir(cancel <-chan struct{}, input *fuse.FsyncIn) fuse.Status {
	c.counts[opFsyncDir].Add(1)
	return c.fs.FsyncDir(cancel, input)
}

func (c *countingFS) StatFs(cancel <-chan struct{}, input *fuse.InHeader, out *fuse.StatfsOut) fuse.Status {
	c.counts[opStatFs].Add(1)
	return c.fs.StatFs(cancel, input, out)
}

func (c *countingFS) Statx(cancel <-chan struct{}, input *fuse.StatxIn, out *fuse.StatxOut) fuse.Status {
	c.counts[opStatx].Add(1)
	return c.fs.Statx(cancel, input, out)
}
