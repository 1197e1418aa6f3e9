package volume

import (
	"context"
	"os"
	"syscall"
	"testing"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hashicorp/go-hclog"
)

// TestPassthroughLossIsReported checks the detector itself: a read that
// reaches a volume file's handle turns the mount's passthrough report off.
func TestPassthroughLossIsReported(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "f")
	if err != nil {
		t.Fatal(err)
	}
	p := NewPlane(hclog.NewNullLogger(), nil, nil, t.TempDir())
	p.SetPassthrough(true)
	fd, err := syscall.Dup(int(f.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	fh := p.wrapFile(gofs.NewLoopbackFile(fd))
	if !p.Passthrough() {
		t.Fatal("Passthrough before any data: got false, want true")
	}
	fh.(gofs.FileReader).Read(context.Background(), make([]byte, 10), 0)
	if p.Passthrough() {
		t.Errorf("Passthrough after a read reached the handle: got true, want false")
	}
}
