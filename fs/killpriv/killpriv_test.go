package killpriv

import (
	"testing"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// doneOf records the cancel channel each write method of the bridge got,
// as the context the bridge makes of it would carry it.
type doneOf struct {
	fuse.RawFileSystem
	write, writev <-chan struct{}
}

func (d *doneOf) Write(cancel <-chan struct{}, _ *fuse.WriteIn, _ []byte) (uint32, fuse.Status) {
	d.write = cancel
	return 0, fuse.OK
}

func (d *doneOf) Writev(cancel <-chan struct{}, _ *fuse.WriteIn, _ [][]byte) (uint32, fuse.Status) {
	d.writev = cancel
	return 0, fuse.OK
}

// TestFlagsOnEveryWriteMethod: a WRITE that asks for the kill reaches
// the bridge as one WriteKills sees, and one that does not keeps its
// cancel channel, whichever method the server calls (the own loop
// Write, go-fuse's server Writev).
func TestFlagsOnEveryWriteMethod(t *testing.T) {
	for _, kill := range []bool{false, true} {
		in := &fuse.WriteIn{}
		if kill {
			in.WriteFlags = fuse.WRITE_KILL_SUIDGID
		}
		d := &doneOf{RawFileSystem: fuse.NewDefaultRawFileSystem()}
		k := Flags{d}
		cancel := make(chan struct{})
		k.Write(cancel, in, []byte("x"))
		k.Writev(cancel, in, [][]byte{[]byte("x")})
		for method, got := range map[string]<-chan struct{}{"Write": d.write, "Writev": d.writev} {
			ctx := &fuse.Context{Cancel: got}
			if WriteKills(ctx) != kill {
				t.Errorf("%s with the kill flag %v: WriteKills %v", method, kill, WriteKills(ctx))
			}
			if !kill && got != (<-chan struct{})(cancel) {
				t.Errorf("%s without the kill flag: the request's cancel channel was replaced", method)
			}
		}
	}
}
