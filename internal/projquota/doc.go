// Package projquota speaks to Linux project quotas (xfs mounted with
// pquota or prjquota, ext4 made with -O quota,project and mounted with
// prjquota): the project ID every inode carries, and the limits and usage
// the kernel keeps per project.
//
// The model, as the kernel keeps it:
//
//	project ID      a number on every inode (FS_IOC_FSGETXATTR's
//	                fsx_projid), 0 by default
//	PROJINHERIT     a directory flag: what is made in it takes its
//	                project ID; and a link or rename into it of an inode
//	                of another project fails (EXDEV), so nothing moves
//	                into a project without being counted there
//	limit, usage    per project: bytes (in 1 KiB blocks) and inodes, set
//	                and read with quotactl_fd(2) (Linux 5.14)
//
// A write past the limit fails with EDQUOT when it allocates blocks,
// whoever writes; usage is read in one call, whatever the project holds.
package projquota
