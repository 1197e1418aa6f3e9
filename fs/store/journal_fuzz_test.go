package store

import (
	"bytes"
	"testing"

	"github.com/allocfs/allocfs/fs/store/record"
)

// FuzzDecodeJournal feeds the journal decoder arbitrary bytes, as a disk
// that tore an append or a corrupted file would: it never panics, the
// whole intents it returns take at most the bytes it was given, and the
// prefix it says they take decodes to the same intents.
func FuzzDecodeJournal(f *testing.F) {
	var journal []byte
	for _, in := range []*intent{
		{Seq: 1, Op: "create", Records: map[string]*record.State{"a": {}}},
		{Seq: 2, Op: "destroy", Records: map[string]*record.State{"a": nil}},
		{Seq: 3, Op: "import", Fresh: []freshLayer{{ID: "l1", Mode: 0o755, UID: -1, GID: -1}}},
	} {
		frame, err := encodeIntent(in)
		if err != nil {
			f.Fatal(err)
		}
		journal = append(journal, frame...)
		f.Add(frame)
	}
	f.Add(journal)
	f.Add(journal[:len(journal)-3])
	flipped := bytes.Clone(journal)
	flipped[len(flipped)/2] ^= 0x40
	f.Add(flipped)
	f.Add([]byte{})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		ins, n, err := decodeJournal(data)
		if err != nil {
			if ins != nil || n != 0 {
				t.Fatalf("an error (%v) with %d intents over %d bytes", err, len(ins), n)
			}
			return
		}
		if n < 0 || n > len(data) {
			t.Fatalf("%d intents take %d of %d bytes", len(ins), n, len(data))
		}
		again, m, err := decodeJournal(data[:n])
		if err != nil || m != n || len(again) != len(ins) {
			t.Fatalf("the first %d bytes decode to %d intents over %d bytes (%v), want %d over %d", n, len(again), m, err, len(ins), n)
		}
		for i := range ins {
			if ins[i].Seq != again[i].Seq || ins[i].Op != again[i].Op {
				t.Fatalf("intent %d decodes to %d/%q, then to %d/%q", i, ins[i].Seq, ins[i].Op, again[i].Seq, again[i].Op)
			}
		}
	})
}
