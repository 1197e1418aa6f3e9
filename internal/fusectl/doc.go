// Package fusectl reaches the kernel's FUSE control filesystem, fusectl:
// one directory per FUSE connection, named by the minor number of the
// connection's device (the st_dev of its mount, the minor of the
// "0:NN" device in /proc/self/mountinfo), holding
//
//	<minor>/waiting               requests queued or sent and not answered
//	<minor>/abort                 a write ends the connection: every
//	                              request waiting on it fails
//	<minor>/max_background        what the kernel lets run in the
//	<minor>/congestion_threshold  background
//
// allocfs reads waiting for its health check and writes abort to end a
// mount that nothing can serve (a connection whose daemon set up FUSE
// rings it then could not use).
//
// # Never an assumption about the host
//
// systemd mounts fusectl at /sys/fs/fuse/connections; a bare host, a
// minimal VM or a container often has nothing there. Open does not care:
// where that directory holds no fusectl it mounts an instance of its own
// as a detached mount (fsopen, fsconfig, fsmount: it belongs to no mount
// namespace, shows in no mount table and goes away with its descriptor),
// so nothing on the host changes. The kernel keeps one fusectl superblock
// for every mount of it, so a detached instance lists every connection
// the mounted one would. Making one needs CAP_SYS_ADMIN in the initial
// user namespace (fusectl cannot be mounted from a user namespace): an
// unprivileged process reaches fusectl only where the host mounted it.
package fusectl
