// Package frame is the framing of the store's journal: how one record of
// an append-only log is laid out so that a reader tells a whole record
// from what a crash tore.
//
// Each payload (the store's intent, as JSON) is written as
//
//	[4 bytes: length of the payload, little endian]
//	[4 bytes: CRC-32C of the payload]
//	[payload]
//
// An append that a crash cut inside write(2) leaves a frame whose length
// runs past the end of the file, or whose checksum does not match what
// follows; Next refuses both, and so does a length beyond Max, which only
// a corrupt header holds. Such a tail was never synced, so no change
// rests on it, and the reader drops it.
//
// It is a package of its own because it knows nothing of what it frames:
// the store decides what a payload means and refuses one that checks out
// but does not decode (another version's), while the framing is a format
// of bytes on a disk that tore them, small enough to be checked whole.
package frame
