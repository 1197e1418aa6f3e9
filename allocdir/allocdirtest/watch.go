//go:build linux

package allocdirtest

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/allocfs/allocfs/allocdir"
)

// errClosedEmpty is what receive reports for a channel closed without
// delivering a value.
var errClosedEmpty = errors.New("channel closed without a value")

// receive waits up to d for one value of ch. ok is false on timeout; a
// channel closed without a value gives errClosedEmpty.
func receive(ch <-chan error, d time.Duration) (err error, ok bool) {
	select {
	case err, open := <-ch:
		if !open {
			return errClosedEmpty, true
		}
		return err, true
	case <-time.After(d):
		return nil, false
	}
}

// wantClosed asserts that ch is closed (after its one value).
func wantClosed(t *testing.T, ch <-chan error) {
	t.Helper()
	select {
	case v, open := <-ch:
		if open {
			t.Errorf("second receive: got value %v, want the channel closed", v)
		}
	case <-time.After(eventTimeout):
		t.Errorf("channel not closed within %v after its value", eventTimeout)
	}
}

// testBlockUntilExists checks BlockUntilExists: later creation, cancel,
// escapes, links planted while waiting, and that it leaks no goroutine.
func testBlockUntilExists(t *testing.T, h *harness) {
	a := h.built(t, allocA, "web")
	outside := t.TempDir()
	apply(t, outside, file("passwd", "OUTSIDE", 0o644))

	// A file created ~100 ms later is reported with nil, then the channel
	// closes.
	t.Run("CreatedLater", func(t *testing.T) {
		before := implGoroutines()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		ch, err := a.BlockUntilExists(ctx, "alloc/logs/web.stdout.0")
		if err != nil {
			t.Fatalf("BlockUntilExists: %v", err)
		}
		created := make(chan error, 1)
		go func() {
			time.Sleep(100 * time.Millisecond)
			created <- os.WriteFile(host(a, "alloc/logs/web.stdout.0"), []byte("x"), 0o644)
		}()
		got, ok := receive(ch, eventTimeout+100*time.Millisecond)
		if err := <-created; err != nil {
			t.Fatalf("creating the file: %v", err)
		}
		if !ok || got != nil {
			t.Fatalf("BlockUntilExists: got (%v, received %v), want nil received", got, ok)
		}
		wantClosed(t, ch)
		cancel()
		settleGoroutines(t, before)
	})

	// Parents that do not exist yet are fine: it waits for the whole path.
	t.Run("MissingParents", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		ch, err := a.BlockUntilExists(ctx, "web/local/a/b/c")
		if err != nil {
			t.Fatalf("BlockUntilExists: %v", err)
		}
		if got, ok := receive(ch, 300*time.Millisecond); ok {
			t.Fatalf("BlockUntilExists before creation: got %v, want nothing yet", got)
		}
		apply(t, a.AllocDirPath(), file("web/local/a/b/c", "", 0o644))
		if got, ok := receive(ch, eventTimeout); !ok || got != nil {
			t.Fatalf("BlockUntilExists: got (%v, received %v), want nil received", got, ok)
		}
	})

	// Cancelling before creation delivers the context's error and closes
	// the channel.
	t.Run("Cancel", func(t *testing.T) {
		before := implGoroutines()
		ctx, cancel := context.WithCancel(context.Background())
		ch, err := a.BlockUntilExists(ctx, "alloc/data/never")
		if err != nil {
			cancel()
			t.Fatalf("BlockUntilExists: %v", err)
		}
		cancel()
		got, ok := receive(ch, eventTimeout)
		if !ok || !errors.Is(got, context.Canceled) {
			t.Fatalf("after cancel: got (%v, received %v), want context.Canceled", got, ok)
		}
		wantClosed(t, ch)
		settleGoroutines(t, before)
	})

	// An escaping path is refused synchronously, without a channel.
	t.Run("Escapes", func(t *testing.T) {
		apply(t, a.AllocDirPath(), symlink("alloc/data/etc", outside))
		for _, p := range []string{"../x", "alloc/../../x", "alloc/data/etc/passwd", "alloc/data/etc/not-yet"} {
			ch, err := a.BlockUntilExists(context.Background(), p)
			if !errors.Is(err, allocdir.ErrEscapes) || ch != nil {
				t.Errorf("BlockUntilExists(%q): got (%v, %v), want (nil, ErrEscapes)", p, ch, err)
			}
		}
	})

	// A link out planted on the awaited path while waiting is never
	// reported as the path existing.
	t.Run("LinkPlantedWhileWaiting", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		ch, err := a.BlockUntilExists(ctx, "alloc/data/later/passwd")
		if err != nil {
			t.Fatalf("BlockUntilExists: %v", err)
		}
		apply(t, a.AllocDirPath(), symlink("alloc/data/later", outside))
		got, ok := receive(ch, eventTimeout)
		switch {
		case ok && got == nil:
			t.Errorf("BlockUntilExists through a link out: got nil (exists), want ErrEscapes or nothing")
		case ok && !errors.Is(got, allocdir.ErrEscapes):
			t.Errorf("BlockUntilExists through a link out: got %v, want ErrEscapes", got)
		}
	})

	// Many waiters, resolved and cancelled, leave no goroutine behind.
	t.Run("NoLeak", func(t *testing.T) {
		before := implGoroutines()
		ctx, cancel := context.WithCancel(context.Background())
		var chans []chan error
		for range 10 {
			ch, err := a.BlockUntilExists(ctx, "alloc/tmp/never")
			if err != nil {
				cancel()
				t.Fatalf("BlockUntilExists: %v", err)
			}
			chans = append(chans, ch)
			ch, err = a.BlockUntilExists(context.Background(), "alloc")
			if err != nil {
				cancel()
				t.Fatalf("BlockUntilExists: %v", err)
			}
			chans = append(chans, ch)
		}
		cancel()
		for i, ch := range chans {
			if _, ok := receive(ch, eventTimeout); !ok {
				t.Fatalf("waiter %d: nothing received within %v", i, eventTimeout)
			}
		}
		settleGoroutines(t, before)
	})
}

// waitEvent waits for the named FileChanges channel to fire within
// eventTimeout, failing on a Deleted that was not asked for. Modified
// events are ignored while waiting for another kind.
func waitEvent(t *testing.T, c *allocdir.FileChanges, want string) {
	t.Helper()
	timeout := time.After(eventTimeout)
	for {
		select {
		case <-c.Modified:
			if want == "Modified" {
				return
			}
		case <-c.Truncated:
			if want == "Truncated" {
				return
			}
			if want == "Deleted" {
				continue
			}
			t.Fatalf("got Truncated, want %s", want)
		case <-c.Deleted:
			if want == "Deleted" {
				return
			}
			t.Fatalf("got Deleted, want %s", want)
		case <-timeout:
			t.Fatalf("no %s within %v", want, eventTimeout)
		}
	}
}

// testChangeEvents checks ChangeEvents: the initial stat error, growth,
// truncation, deletion, replacement, and that cancel stops it.
func testChangeEvents(t *testing.T, h *harness) {
	a := h.built(t, allocA, "web")
	outside := t.TempDir()
	apply(t, outside, file("other", "OUTSIDE", 0o644))

	// watch creates a log file with content and watches it from its end.
	watch := func(t *testing.T, name, content string) (*allocdir.FileChanges, string) {
		t.Helper()
		apply(t, a.AllocDirPath(), file("alloc/logs/"+name, content, 0o644))
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		c, err := a.ChangeEvents(ctx, "alloc/logs/"+name, int64(len(content)))
		if err != nil || c == nil {
			t.Fatalf("ChangeEvents(%s): got (%v, %v), want changes", name, c, err)
		}
		return c, host(a, "alloc/logs/"+name)
	}

	// A missing file is its stat error, returned synchronously.
	t.Run("Missing", func(t *testing.T) {
		c, err := a.ChangeEvents(context.Background(), "alloc/logs/missing", 0)
		if !errors.Is(err, os.ErrNotExist) || c != nil {
			t.Errorf("ChangeEvents(missing): got (%v, %v), want (nil, fs.ErrNotExist)", c, err)
		}
	})

	// Appending fires Modified.
	t.Run("Modified", func(t *testing.T) {
		c, p := watch(t, "append.log", "first\n")
		f, err := os.OpenFile(p, os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteString("second\n"); err != nil {
			t.Fatal(err)
		}
		f.Close()
		waitEvent(t, c, "Modified")
	})

	// A file that is already longer than curOffset fires Modified without
	// a write.
	t.Run("BehindOffset", func(t *testing.T) {
		apply(t, a.AllocDirPath(), file("alloc/logs/behind.log", "0123456789", 0o644))
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		c, err := a.ChangeEvents(ctx, "alloc/logs/behind.log", 4)
		if err != nil {
			t.Fatalf("ChangeEvents: %v", err)
		}
		waitEvent(t, c, "Modified")
	})

	// Truncating to zero fires Truncated.
	t.Run("Truncated", func(t *testing.T) {
		c, p := watch(t, "trunc.log", "some bytes to cut\n")
		if err := os.Truncate(p, 0); err != nil {
			t.Fatal(err)
		}
		waitEvent(t, c, "Truncated")
	})

	// Removing the file fires Deleted.
	t.Run("Deleted", func(t *testing.T) {
		c, p := watch(t, "rm.log", "x\n")
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
		waitEvent(t, c, "Deleted")
	})

	// Renaming another file onto the name (log rotation) fires Deleted.
	t.Run("RenameOver", func(t *testing.T) {
		c, p := watch(t, "rot.log", "old\n")
		apply(t, a.AllocDirPath(), file("alloc/logs/rot.log.new", "new\n", 0o644))
		if err := os.Rename(p+".new", p); err != nil {
			t.Fatal(err)
		}
		waitEvent(t, c, "Deleted")
	})

	// Renaming a link out of the allocation onto the name fires Deleted
	// (and the watcher survives the escape it now resolves to).
	t.Run("ReplacedByLinkOut", func(t *testing.T) {
		c, p := watch(t, "swap.log", "x\n")
		apply(t, a.AllocDirPath(), symlink("alloc/logs/swap.log.new", outside+"/other"))
		if err := os.Rename(p+".new", p); err != nil {
			t.Fatal(err)
		}
		waitEvent(t, c, "Deleted")
	})

	// After cancel no event fires and no goroutine is left.
	t.Run("Cancel", func(t *testing.T) {
		before := implGoroutines()
		apply(t, a.AllocDirPath(), file("alloc/logs/cancel.log", "x\n", 0o644))
		ctx, cancel := context.WithCancel(context.Background())
		var watchers []*allocdir.FileChanges
		for range 5 {
			c, err := a.ChangeEvents(ctx, "alloc/logs/cancel.log", 2)
			if err != nil {
				cancel()
				t.Fatalf("ChangeEvents: %v", err)
			}
			watchers = append(watchers, c)
		}
		cancel()
		settleGoroutines(t, before)
		for _, c := range watchers {
			drain(c)
		}
		f, err := os.OpenFile(host(a, "alloc/logs/cancel.log"), os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		f.WriteString("more\n")
		f.Close()
		time.Sleep(4 * allocdir.PollInterval)
		for i, c := range watchers {
			select {
			case <-c.Modified:
				t.Errorf("watcher %d: got Modified after cancel, want nothing", i)
			default:
			}
		}
	})
}

// drain empties the channels of a FileChanges.
func drain(c *allocdir.FileChanges) {
	for {
		select {
		case <-c.Modified:
		case <-c.Truncated:
		case <-c.Deleted:
		default:
			return
		}
	}
}
