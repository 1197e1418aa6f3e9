package fsapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"
	"time"
)

// lockedBuffer is the client side of a framer: what it was sent, safe to
// read while the framer's timer writes.
type lockedBuffer struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	flushes int
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) flush() {
	b.mu.Lock()
	b.flushes++
	b.mu.Unlock()
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// decodeFrames decodes concatenated frames as a Nomad client does.
func decodeFrames(t *testing.T, s string) []Frame {
	t.Helper()
	var out []Frame
	dec := json.NewDecoder(strings.NewReader(s))
	for {
		var f Frame
		err := dec.Decode(&f)
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("decoding frames %q: %v", s, err)
		}
		out = append(out, f)
	}
}

// An hour: timers that never fire during a test.
const never = time.Hour

// TestFramerEncoding checks the bytes on the wire: Nomad's field names,
// empty fields left out, base64 data, no separators, no HTML escaping.
func TestFramerEncoding(t *testing.T) {
	var b lockedBuffer
	f := newFramerEvery(&b, b.flush, false, never, never)
	if err := f.send("alloc/logs/a<b>.stdout.0", "", []byte("hi\n"), 3); err != nil {
		t.Fatal(err)
	}
	if err := f.send("alloc/logs/a<b>.stdout.0", eventTruncated, nil, 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	want := `{"Offset":3,"Data":"aGkK","File":"alloc/logs/a<b>.stdout.0"}` +
		`{"File":"alloc/logs/a<b>.stdout.0","FileEvent":"file truncated"}`
	if got := b.String(); got != want {
		t.Errorf("wire:\n got %s\nwant %s", got, want)
	}
}

// TestFramerBatching checks that small sends merge into one frame whose
// Offset is the position after the first chunk (Nomad's quirk), that a
// full frame goes out at once, and that another file flushes first.
func TestFramerBatching(t *testing.T) {
	var b lockedBuffer
	f := newFramerEvery(&b, b.flush, false, never, never)
	for _, c := range []struct {
		data string
		end  int64
	}{{"one\n", 4}, {"two\n", 8}, {"three\n", 14}} {
		if err := f.send("f0", "", []byte(c.data), c.end); err != nil {
			t.Fatal(err)
		}
	}
	if got := b.String(); got != "" {
		t.Fatalf("small sends went out before a flush: %s", got)
	}
	if err := f.send("f1", "", []byte("x"), 1); err != nil {
		t.Fatal(err)
	}
	big := bytes.Repeat([]byte("y"), frameSize+10)
	if err := f.send("f2", "", big, int64(len(big))); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	frames := decodeFrames(t, b.String())
	if len(frames) != 4 {
		t.Fatalf("got %d frames, want 4 (f0 merged, f1, f2 full, f2 rest): %+v", len(frames), frames)
	}
	if fr := frames[0]; fr.File != "f0" || fr.Offset != 4 || string(fr.Data) != "one\ntwo\nthree\n" {
		t.Errorf("merged frame: got %+v, want f0 at offset 4 with all three lines", fr)
	}
	if fr := frames[1]; fr.File != "f1" || string(fr.Data) != "x" {
		t.Errorf("second frame: got %+v", fr)
	}
	if len(frames[2].Data) != frameSize || len(frames[3].Data) != 10 || frames[2].Offset != int64(len(big)) || frames[3].Offset != int64(len(big)) {
		t.Errorf("big send: got frames of %d and %d bytes at offsets %d, %d; want %d and 10, both at %d",
			len(frames[2].Data), len(frames[3].Data), frames[2].Offset, frames[3].Offset, frameSize, len(big))
	}
}

// TestFramerTimers checks the periodic flush and the heartbeats, and that
// plain mode sends bare data and no heartbeat.
func TestFramerTimers(t *testing.T) {
	var b lockedBuffer
	f := newFramerEvery(&b, b.flush, false, 10*time.Millisecond, 30*time.Millisecond)
	if err := f.send("f", "", []byte("data"), 4); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return strings.Contains(b.String(), `"Data":"ZGF0YQ=="`) }, "the periodic flush")
	waitFor(t, func() bool { return strings.Contains(b.String(), `{}`) }, "a heartbeat")
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}

	var p lockedBuffer
	f = newFramerEvery(&p, p.flush, true, 10*time.Millisecond, 10*time.Millisecond)
	if err := f.send("f", "", []byte("raw bytes"), 9); err != nil {
		t.Fatal(err)
	}
	if err := f.send("f", eventTruncated, nil, 0); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return p.String() == "raw bytes" }, "plain data")
	time.Sleep(50 * time.Millisecond)
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if got := p.String(); got != "raw bytes" {
		t.Errorf("plain stream: got %q, want only the data", got)
	}
}

// brokenWriter fails every write, as a connection whose client left.
type brokenWriter struct{}

func (brokenWriter) Write([]byte) (int, error) { return 0, errors.New("broken pipe") }

// TestFramerClientGone checks that a failed write ends sending.
func TestFramerClientGone(t *testing.T) {
	f := newFramerEvery(brokenWriter{}, func() {}, false, never, never)
	big := bytes.Repeat([]byte("z"), frameSize)
	if err := f.send("f", "", big, frameSize); !errors.Is(err, errClientGone) {
		t.Errorf("send to a gone client: got %v, want errClientGone", err)
	}
	if err := f.send("f", "", []byte("more"), frameSize+4); !errors.Is(err, errClientGone) {
		t.Errorf("next send: got %v, want errClientGone", err)
	}
	if err := f.Close(); !errors.Is(err, errClientGone) {
		t.Errorf("Close: got %v, want errClientGone", err)
	}
}

func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within 5s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestStartOfLogs checks where origin and offset put the start, across
// files, clamped at both ends.
func TestStartOfLogs(t *testing.T) {
	files := []logFile{{index: 3, size: 10}, {index: 4, size: 5}, {index: 6, size: 20}}
	for _, tc := range []struct {
		origin  string
		offset  int64
		idx, at int64
	}{
		{originStart, 0, 3, 0},
		{originStart, 9, 3, 9},
		{originStart, 10, 4, 0},
		{originStart, 14, 4, 4},
		{originStart, 15, 6, 0},
		{originStart, 34, 6, 19},
		{originStart, 1000, 6, 20},
		{originEnd, 0, 6, 20},
		{originEnd, 20, 6, 0},
		{originEnd, 21, 4, 4},
		{originEnd, 25, 4, 0},
		{originEnd, 26, 3, 9},
		{originEnd, 1000, 3, 0},
	} {
		idx, at := startOfLogs(files, tc.origin, tc.offset)
		if idx != tc.idx || at != tc.at {
			t.Errorf("%s+%d: got file %d at %d, want file %d at %d", tc.origin, tc.offset, idx, at, tc.idx, tc.at)
		}
	}
}
