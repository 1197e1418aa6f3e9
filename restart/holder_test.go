//go:build linux

package restart

import (
	"net"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// serveFakeHolder answers the holder's memory requests on a socket in a
// fresh directory, with the holder's own code, until the test ends, and
// returns the socket's path.
func serveFakeHolder(t *testing.T) string {
	t.Helper()
	socket := filepath.Join(t.TempDir(), "holder.sock")
	ln, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	kept := make(map[string]int)
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			serveHolderRequest(c.(*net.UnixConn), kept)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		for _, fd := range kept {
			unix.Close(fd)
		}
	})
	return socket
}

// TestHolderMemoryRequests: a holder that keeps no memory volume answers
// "names" with nothing, which ends its stream at once; that is an empty
// set of volumes, not a failure. One it keeps comes back by its key, and
// a drop of a volume whose holder is gone (its socket removed, or nothing
// listening on it) has nothing left to drop.
func TestHolderMemoryRequests(t *testing.T) {
	socket := serveFakeHolder(t)
	held, err := HeldMemory(socket)
	if err != nil || len(held) != 0 {
		t.Fatalf("HeldMemory of a holder keeping nothing: %v, %v; want none and no error", held, err)
	}

	dir, err := os.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	k := HolderKeeper{Socket: socket}
	if err := k.Keep("a1/web/secrets", int(dir.Fd())); err != nil {
		t.Fatal(err)
	}
	held, err = HeldMemory(socket)
	if err != nil || len(held) != 1 || held["a1/web/secrets"] < 0 {
		t.Fatalf("HeldMemory after a keep: %v, %v; want a1/web/secrets", held, err)
	}
	CloseAll(held)
	if err := k.Drop("a1/web/secrets"); err != nil {
		t.Fatal(err)
	}
	if held, err := HeldMemory(socket); err != nil || len(held) != 0 {
		t.Fatalf("HeldMemory after the drop: %v, %v; want none", held, err)
	}

	gone := HolderKeeper{Socket: filepath.Join(t.TempDir(), "holder.sock")}
	if err := gone.Drop("a1/web/secrets"); err != nil {
		t.Errorf("a drop without a holder's socket: %v, want nothing to drop", err)
	}
	// A socket a killed holder left: nothing accepts on it.
	ln, err := net.Listen("unix", gone.Socket)
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close()
	if err := gone.Drop("a1/web/secrets"); err != nil {
		t.Errorf("a drop on a dead holder's socket: %v, want nothing to drop", err)
	}
	if _, err := HeldMemory(gone.Socket); err == nil {
		t.Errorf("HeldMemory of a dead holder's socket: no error")
	}
}
