// Package allocdirtest is the conformance suite of allocdir.Interface.
// Every implementation (the on-disk disk.AllocDir, the FUSE-backed
// allocation directory of package fs, and any later one) runs it, and the
// suite, not the prose of the interface, is where the exact semantics are
// pinned down.
//
// # Running the suite for an implementation
//
// Write one test in the implementation's package that hands [Run] a
// [NewStore]: a function that, for each case, sets up a fresh, empty
// store and returns a constructor of allocations in it.
//
//	func TestConformance(t *testing.T) {
//		allocdirtest.Run(t, func(t *testing.T) func(string) allocdir.Interface {
//			root := t.TempDir()
//			return func(id string) allocdir.Interface {
//				d, err := disk.New(allocdirtest.Logger(t), root, id)
//				if err != nil {
//					t.Fatal(err)
//				}
//				return d
//			}
//		})
//	}
//
// The store is whatever the implementation needs: a directory for the
// on-disk one, a mounted filesystem (mounted in NewStore, unmounted with
// t.Cleanup) for the FUSE one. Three things are required of it:
//
//   - Allocations returned by one store can Move to and from each other.
//   - Once Build has run, AllocDirPath is a live host path: the suite
//     creates its fixtures (files, links, FIFOs, modes) with ordinary os
//     calls below it and checks the results with os.Lstat. For the on-disk
//     implementation that is the real directory; for the FUSE one it is
//     the allocation's path inside the mount.
//   - Every allocation can be destroyed: the suite registers Destroy as a
//     cleanup of each allocation it creates and reports its errors.
//
// [Logger] gives an hclog.Logger that writes to the test's log, and drops
// lines logged after the test finished instead of panicking.
//
// # What it checks
//
// Each case is a subtest with a fresh store, and each assertion inside it
// a named subtest with a one-line comment saying what it asserts:
//
//   - Layout: what Build and TaskDir.Build create, modes and owners, the
//     TaskDir paths, the task registry, idempotence, invalid task names.
//   - List, Stat, ReadAt: the read side with Nomad's semantics (lstat
//     listings, followed stats, content types, FileInfo's JSON), and the
//     secrets/private refusal applied to the resolved path (nomad#28468).
//   - Escapes: every path-taking operation refuses "..", links out
//     (absolute, relative, at the end of a chain) and loops, and never
//     returns anything it refused.
//   - BlockUntilExists and ChangeEvents: events within two seconds,
//     cancellation, and no goroutine left behind.
//   - Move and Destroy: what moves and what stays (nomad#18034), what a
//     refused Move leaves, teardown that does not follow links out.
//   - Snapshot: Nomad's tar layout and a round trip through
//     snapshot.Extract.
//   - MaliciousArchives: crafted archives (CVE-2024-1329, CVE-2022-24683,
//     the write-through-link of nomad PR #23738, hard links, FIFOs,
//     devices, sparse files in the GNU and PAX forms, limits, truncation,
//     the sender's error entry, names outside the layout) are refused with allocdir.ErrArchive and leave nothing
//     behind, in the destination or outside it.
//
// # Requirements and timing
//
// The suite is built only on Linux: the implementations it checks, and
// the snapshot extractor it checks them with, exist nowhere else.
//
// Ownership assertions need root and are skipped otherwise, with the
// reason; everything else runs unprivileged. The escape cases expect
// /etc/passwd to exist. Watchers are given two seconds to report an
// event, which is several periods of a polling implementation
// (allocdir.PollInterval); calls that must not block (reading a FIFO,
// following a link loop) are given five.
//
// Cases count goroutines before and after watchers stop, so the suite does
// not call t.Parallel and the implementation must not start goroutines
// that outlive the calls that need them. Run it with -race.
//
// When a case fails, the tree of every allocation it created is logged
// before the allocation is destroyed.
package allocdirtest
