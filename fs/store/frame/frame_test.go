package frame

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"testing"
)

// TestNext checks that whole frames read back as written, one after the
// other, and that what a crash or a corrupt disk leaves is no frame: a
// cut at any byte, a flipped bit, a length beyond Max.
func TestNext(t *testing.T) {
	payloads := [][]byte{[]byte(`{"seq":1}`), {}, []byte(`{"seq":3,"op":"destroy"}`)}
	var log []byte
	for _, p := range payloads {
		log = append(log, Encode(p)...)
	}
	off := 0
	for i, want := range payloads {
		got, n, ok := Next(log[off:])
		if !ok || !bytes.Equal(got, want) || n != Header+len(want) {
			t.Fatalf("frame %d: %q over %d bytes (%v), want %q over %d", i, got, n, ok, want, Header+len(want))
		}
		off += n
	}
	if _, _, ok := Next(log[off:]); ok {
		t.Errorf("a frame past the last one")
	}
	last := Encode(payloads[2])
	for cut := range len(last) {
		if _, _, ok := Next(last[:cut]); ok {
			t.Errorf("a frame cut after %d of its %d bytes reads whole", cut, len(last))
		}
	}
	flipped := bytes.Clone(last)
	flipped[len(flipped)-1] ^= 0x40
	if _, _, ok := Next(flipped); ok {
		t.Errorf("a frame with a flipped payload bit reads whole")
	}
	// Whole and checked, but longer than any payload Encode may frame.
	huge := make([]byte, Header+Max+1)
	binary.LittleEndian.PutUint32(huge[0:4], Max+1)
	binary.LittleEndian.PutUint32(huge[4:8], crc32.Checksum(huge[Header:], crc32c))
	if _, _, ok := Next(huge); ok {
		t.Errorf("a frame of %d bytes, over Max, reads whole", Max+1)
	}
}
