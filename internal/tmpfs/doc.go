// Package tmpfs makes kernel tmpfs instances that belong to no mount
// namespace: each is created with the new mount API (fsopen, fsconfig,
// fsmount) and never attached anywhere, so no mount table shows it and
// nothing reaches it but its descriptor and what that descriptor is
// handed to. The instance lives as long as one descriptor of it (or of a
// file in it) is open: a process that keeps the descriptors, such as the
// holder of the FUSE connection, keeps the files, whoever else dies.
//
// What a memory volume needs of it:
//
//	size=      the byte cap (the kernel rounds it up to pages)
//	nr_inodes= the entry cap
//	mode=, uid=, gid=   the root directory's
//	noswap     (Linux 6.4) pages are never written to swap; where the
//	           kernel refuses it the instance is made without it and
//	           FS.NoSwap says so
//	nodev, nosuid on the mount: a device node or a set-id file made in
//	           it is never honoured through it
//
// FS keeps the root open O_RDONLY (fsmount's own descriptor is an O_PATH
// one, which open_by_handle_at refuses, so a takeover could not find a
// node again through it). The root is reached as /proc/self/fd/<fd>
// (FS.Path), which the kernel resolves to the mount's root without any
// mount table, and which every *at system call can start from.
package tmpfs
