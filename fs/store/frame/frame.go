package frame

import (
	"encoding/binary"
	"hash/crc32"
)

const (
	// Header is the bytes a frame takes before its payload: the
	// payload's length and its checksum.
	Header = 8
	// Max bounds one payload; a length beyond it is a torn or corrupt
	// frame, not a payload to allocate memory for.
	Max = 64 << 20
)

var crc32c = crc32.MakeTable(crc32.Castagnoli)

// Encode frames payload, which must be at most Max bytes: Next refuses a
// longer one as it refuses a torn one.
func Encode(payload []byte) []byte {
	frame := make([]byte, Header, Header+len(payload))
	binary.LittleEndian.PutUint32(frame[0:4], uint32(len(payload)))
	binary.LittleEndian.PutUint32(frame[4:8], crc32.Checksum(payload, crc32c))
	return append(frame, payload...)
}

// Next returns the payload of the whole frame at the start of data and
// how many bytes the frame takes. ok is false where data starts with no
// whole frame: at its end, or where an append was torn (a length beyond
// what follows or beyond Max, or a checksum that does not match).
func Next(data []byte) (payload []byte, n int, ok bool) {
	if len(data) < Header {
		return nil, 0, false
	}
	size := int(binary.LittleEndian.Uint32(data[0:4]))
	sum := binary.LittleEndian.Uint32(data[4:8])
	if size > Max || len(data)-Header < size {
		return nil, 0, false
	}
	payload = data[Header : Header+size]
	if crc32.Checksum(payload, crc32c) != sum {
		return nil, 0, false
	}
	return payload, Header + size, true
}
