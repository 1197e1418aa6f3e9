package fsapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"sync"
	"time"
)

// Framing parameters, Nomad's.
const (
	// frameSize is the most data one frame carries.
	frameSize = 64 << 10
	// flushEvery is how long data waits for more before it is sent.
	flushEvery = 200 * time.Millisecond
	// heartbeatEvery is how often an empty frame tells the client the
	// stream is alive.
	heartbeatEvery = time.Second
)

// File events a frame can carry.
const (
	eventDeleted   = "file deleted"
	eventTruncated = "file truncated"
)

// Frame is one unit of a framed stream, encoded exactly as Nomad's
// StreamFrame: every field is left out when empty, so a heartbeat is {}.
type Frame struct {
	// Offset is the position in File after the first chunk of Data.
	Offset int64 `json:",omitempty"`
	// Data is base64 in JSON.
	Data []byte `json:",omitempty"`
	// File is the path inside the allocation the data comes from.
	File string `json:",omitempty"`
	// FileEvent is "file deleted" or "file truncated".
	FileEvent string `json:",omitempty"`
}

// errClientGone is returned by send once writing to the client failed.
var errClientGone = errors.New("client went away")

// framer batches data into frames and writes them, flushing each one, to
// the client. It is safe for one sender plus its own timer goroutine.
type framer struct {
	w     io.Writer
	flush func()
	plain bool

	mu sync.Mutex
	// cur describes the frame being filled; open says whether there is
	// one. Its data waits in data.
	cur  Frame
	open bool
	data bytes.Buffer
	err  error

	stop chan struct{}
	done chan struct{}
}

// newFramer starts a framer writing to w; flush pushes what was written to
// the client. Close must be called to flush the rest and stop its timers.
func newFramer(w io.Writer, flush func(), plain bool) *framer {
	return newFramerEvery(w, flush, plain, flushEvery, heartbeatEvery)
}

// newFramerEvery is newFramer with other periods, for tests.
func newFramerEvery(w io.Writer, flush func(), plain bool, flushPeriod, heartbeatPeriod time.Duration) *framer {
	f := &framer{w: w, flush: flush, plain: plain, stop: make(chan struct{}), done: make(chan struct{})}
	go f.run(flushPeriod, heartbeatPeriod)
	return f
}

func (f *framer) run(flushPeriod, heartbeatPeriod time.Duration) {
	defer close(f.done)
	flushTick := time.NewTicker(flushPeriod)
	defer flushTick.Stop()
	heartbeat := time.NewTicker(heartbeatPeriod)
	defer heartbeat.Stop()
	for {
		select {
		case <-f.stop:
			return
		case <-flushTick.C:
			f.mu.Lock()
			if f.open {
				f.writeLocked(f.takeLocked(f.data.Len()))
				f.open = false
			}
			f.mu.Unlock()
		case <-heartbeat.C:
			f.mu.Lock()
			if !f.plain {
				f.writeLocked(Frame{})
			}
			f.mu.Unlock()
		}
	}
}

// send adds data read from file (offset is the position after it) to the
// stream, with event when one happened just before it. It returns
// errClientGone once the client cannot be written to.
func (f *framer) send(file, event string, data []byte, offset int64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return f.err
	}
	if f.open && (f.cur.File != file || f.cur.FileEvent != event) {
		f.writeLocked(f.takeLocked(f.data.Len()))
		f.open = false
	}
	if !f.open {
		f.cur = Frame{Offset: offset, File: file, FileEvent: event}
		f.open = true
	}
	f.data.Write(data)
	// An event with no data is sent at once: it is news by itself.
	force := f.data.Len() == 0 && event != ""
	for f.err == nil && (f.data.Len() >= frameSize || force) {
		force = false
		f.writeLocked(f.takeLocked(frameSize))
	}
	if f.data.Len() == 0 {
		f.open = false
	}
	return f.err
}

// takeLocked returns a frame of the current file with up to n bytes of
// the pending data.
func (f *framer) takeLocked(n int) Frame {
	fr := f.cur
	if n > f.data.Len() {
		n = f.data.Len()
	}
	if n > 0 {
		fr.Data = append([]byte(nil), f.data.Next(n)...)
	}
	return fr
}

// writeLocked writes one frame to the client and flushes it.
func (f *framer) writeLocked(fr Frame) {
	if f.err != nil {
		return
	}
	var err error
	if f.plain {
		if len(fr.Data) > 0 {
			_, err = f.w.Write(fr.Data)
		}
	} else {
		err = encodeFrame(f.w, fr)
	}
	if err != nil {
		f.err = errClientGone
		return
	}
	f.flush()
}

// encodeFrame writes fr as Nomad's JSON handle does: no HTML escaping and
// no separator between frames.
func encodeFrame(w io.Writer, fr Frame) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(fr); err != nil {
		return err
	}
	_, err := w.Write(bytes.TrimSuffix(buf.Bytes(), []byte("\n")))
	return err
}

// Close sends what is pending and stops the framer's timers. It returns
// errClientGone if the client could not be written to.
func (f *framer) Close() error {
	close(f.stop)
	<-f.done
	f.mu.Lock()
	defer f.mu.Unlock()
	for f.open && f.err == nil {
		f.writeLocked(f.takeLocked(frameSize))
		f.open = f.data.Len() > 0
	}
	return f.err
}
