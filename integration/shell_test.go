package integration

import (
	"crypto/rand"
	"encoding/hex"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/allocfs/allocfs/allocdir/allocdirtest"
	"github.com/allocfs/allocfs/fs/fstest"
	"github.com/allocfs/allocfs/integration/harness"
	"golang.org/x/sys/unix"
)

// TestShellTools: the tools people and task drivers point at an
// allocation directory work through the mount, one tool per subtest, all
// against allocation a1 with task web. Every subtest checks outcomes
// (bytes, exit codes, modes, owners, mtimes), not only that the tool ran.
func TestShellTools(t *testing.T) {
	fstest.RequireFUSE(t)
	n := startNode(t)
	n.mustCLI(t, "alloc", "create", "a1", "--task", "web")
	a1 := filepath.Join(n.mnt, "a1")

	// ls -la shows the shared alloc/ and the task directory as Nomad
	// makes them: world-writable and owned by nobody.
	t.Run("ls", func(t *testing.T) {
		out := n.mustSh(t, a1, "ls -la")
		entries := map[string][]string{}
		for _, line := range strings.Split(out, "\n") {
			f := strings.Fields(line)
			if len(f) >= 9 {
				entries[f[len(f)-1]] = f
			}
		}
		for _, name := range []string{"alloc", "web"} {
			f, ok := entries[name]
			if !ok {
				t.Errorf("ls -la %s: no %s/ in\n%s", a1, name, out)
				continue
			}
			if f[0] != "drwxrwxrwx" || f[2] != "nobody" {
				t.Errorf("ls -la: %s/ is %s owned by %s, want drwxrwxrwx owned by nobody", name, f[0], f[2])
			}
		}
	})

	// echo >> appends to a log and cat reads it back, from both views of
	// alloc/.
	t.Run("echo append and cat", func(t *testing.T) {
		got := n.mustSh(t, a1, `
			echo first >> alloc/logs/web.stdout.0
			echo second >> alloc/logs/web.stdout.0
			cat alloc/logs/web.stdout.0
			cat web/alloc/logs/web.stdout.0`)
		if want := "first\nsecond\nfirst\nsecond\n"; got != want {
			t.Errorf("cat after two appends: got %q, want %q", got, want)
		}
	})

	// tail -f follows a log that another process appends to.
	t.Run("tail -f", func(t *testing.T) {
		log := filepath.Join(a1, "alloc", "logs", "web.stderr.0")
		n.mustSh(t, a1, "echo before > alloc/logs/web.stderr.0")
		var out allocdirtest.SyncBuffer
		tail := exec.Command("tail", "-n", "+1", "-f", log)
		tail.Stdout, tail.Stderr = &out, &out
		if err := tail.Start(); err != nil {
			t.Fatalf("start tail: %v", err)
		}
		defer func() {
			tail.Process.Kill()
			tail.Wait()
		}()
		if !waitFor(5*time.Second, func() bool { return out.String() == "before\n" }) {
			t.Fatalf("tail -n +1 -f printed %q within 5s, want %q", out.String(), "before\n")
		}
		n.mustSh(t, a1, "for i in 1 2 3; do echo line $i >> alloc/logs/web.stderr.0; done")
		want := "before\nline 1\nline 2\nline 3\n"
		if !waitFor(5*time.Second, func() bool { return out.String() == want }) {
			t.Errorf("tail -f after three appends: got %q within 5s, want %q", out.String(), want)
		}
	})

	t.Run("find", func(t *testing.T) {
		got := n.mustSh(t, filepath.Join(a1, "alloc", "data"), `
			mkdir -p find/a/b find/empty
			echo c > find/a/b/c.txt
			echo d > find/a/d.log
			echo e > find/e.txt
			ln -s e.txt find/link
			echo '# files'; find find -type f | sort
			echo '# dirs'; find find -type d | sort
			echo '# links'; find find -type l
			echo '# logs'; find find -name '*.log'`)
		want := `# files
find/a/b/c.txt
find/a/d.log
find/e.txt
# dirs
find
find/a
find/a/b
find/empty
# links
find/link
# logs
find/a/d.log
`
		if got != want {
			t.Errorf("find: got\n%s\nwant\n%s", got, want)
		}
	})

	// du counts allocated blocks, so st_blocks must be right.
	t.Run("du -s", func(t *testing.T) {
		out := n.mustSh(t, filepath.Join(a1, "alloc", "data"), `
			mkdir du
			head -c 1048576 /dev/urandom > du/blob
			sync du/blob
			du -sk du | cut -f1`)
		kib, err := strconv.Atoi(strings.TrimSpace(out))
		if err != nil || kib < 1024 {
			t.Errorf("du -sk of a directory holding 1 MiB: got %q, want at least 1024", out)
		}
	})

	t.Run("stat size", func(t *testing.T) {
		got := n.mustSh(t, filepath.Join(a1, "web", "local"), `
			head -c 12345 /dev/zero > sized
			stat -c %s sized
			truncate -s 7 sized
			stat -c %s sized
			: > sized
			stat -c %s sized`)
		if want := "12345\n7\n0\n"; got != want {
			t.Errorf("stat -c %%s after write, truncate, empty: got %q, want %q", got, want)
		}
	})

	// cp -a in and out again preserves content, symlinks, modes, owners
	// and nanosecond mtimes.
	t.Run("cp -a round trip", func(t *testing.T) {
		outside := t.TempDir()
		makeTree(t, n, outside)
		src := filepath.Join(outside, "tree")
		out := filepath.Join(outside, "out")
		in := filepath.Join(a1, "alloc", "data", "cp-tree")
		n.mustSh(t, a1, "cp -a "+q(src)+" "+q(in)+" && cp -a "+q(in)+" "+q(out))
		if r := n.sh(t, a1, "diff -r --no-dereference "+q(src)+" "+q(out)); r.code != 0 {
			t.Errorf("diff -r of the tree and its copy through the mount: exit %d, want 0\n%s%s", r.code, r.stdout, r.stderr)
		}
		want := treeListing(t, n, src)
		if got := treeListing(t, n, in); got != want {
			t.Errorf("tree copied in with cp -a:\n%s\nwant\n%s", got, want)
		}
		if got := treeListing(t, n, out); got != want {
			t.Errorf("tree copied in and out with cp -a:\n%s\nwant\n%s", got, want)
		}
	})

	// tar c from the mount and tar x into it give the same tree.
	t.Run("tar round trip", func(t *testing.T) {
		archive := filepath.Join(t.TempDir(), "tree.tar")
		data := filepath.Join(a1, "alloc", "data")
		makeTree(t, n, data)
		n.mustSh(t, a1, `
			tar --format=posix -C alloc/data -cf `+q(archive)+` tree
			mkdir web/local/untar
			tar -C web/local/untar -xpf `+q(archive))
		extracted := filepath.Join(a1, "web", "local", "untar", "tree")
		if r := n.sh(t, a1, "diff -r --no-dereference alloc/data/tree web/local/untar/tree"); r.code != 0 {
			t.Errorf("diff -r of the tree and its tar round trip: exit %d, want 0\n%s%s", r.code, r.stdout, r.stderr)
		}
		want := treeListing(t, n, filepath.Join(data, "tree"))
		if got := treeListing(t, n, extracted); got != want {
			t.Errorf("tree after tar c | tar x:\n%s\nwant\n%s", got, want)
		}
	})

	// A FIFO made in alloc/logs is a FIFO: a writer and a reader meet
	// through it (the kernel serves the pipe; the daemon only stores the
	// node).
	t.Run("mkfifo", func(t *testing.T) {
		got := n.mustSh(t, filepath.Join(a1, "alloc", "logs"), `
			mkfifo pipe
			stat -c %F pipe
			( echo through the fifo > pipe ) &
			read -r line < pipe
			wait $!
			echo "$line"`)
		if want := "fifo\nthrough the fifo\n"; got != want {
			t.Errorf("mkfifo, then a writer and a reader: got %q, want %q", got, want)
		}
	})

	t.Run("ln -s and readlink", func(t *testing.T) {
		got := n.mustSh(t, filepath.Join(a1, "alloc", "data"), `
			echo linked > target.txt
			ln -s target.txt link.txt
			ln -s ../logs dir-link
			ln -s /nonexistent/dangling dangling
			readlink link.txt dir-link dangling
			stat -c %F link.txt
			cat link.txt
			test -d dir-link/
			test -L dangling && test ! -e dangling && echo dangling ok`)
		want := "target.txt\n../logs\n/nonexistent/dangling\nsymbolic link\nlinked\ndangling ok\n"
		if got != want {
			t.Errorf("ln -s then readlink: got %q, want %q", got, want)
		}
	})

	// mv inside one volume is a rename: same inode, old names gone.
	t.Run("mv within a volume", func(t *testing.T) {
		got := n.mustSh(t, filepath.Join(a1, "alloc", "data"), `
			mkdir -p mv/d
			echo one > mv/f
			echo two > mv/d/g
			ino=$(stat -c %i mv/f)
			mv mv/f mv/d/f2
			mv mv/d mv/d2
			test ! -e mv/f && test ! -e mv/d
			[ "$(stat -c %i mv/d2/f2)" = "$ino" ] || echo "inode changed by mv"
			cat mv/d2/f2 mv/d2/g`)
		if want := "one\ntwo\n"; got != want {
			t.Errorf("mv within alloc/data: got %q, want %q", got, want)
		}
	})

	// mv from alloc/data to web/local crosses volumes: rename(2) may
	// refuse with EXDEV, and mv then copies and removes; either way the
	// result is the same, attributes included.
	t.Run("mv across volumes", func(t *testing.T) {
		got := n.mustSh(t, a1, `
			mkdir -p alloc/data/xv/sub
			echo file > alloc/data/xv/f
			echo nested > alloc/data/xv/sub/g
			chmod 0640 alloc/data/xv/f
			touch -d @981173106 alloc/data/xv/f
			echo single > alloc/data/single
			mv alloc/data/xv web/local/xv
			mv alloc/data/single web/local/single
			test ! -e alloc/data/xv && test ! -e alloc/data/single
			cat web/local/xv/f web/local/xv/sub/g web/local/single
			stat -c '%a %Y' web/local/xv/f`)
		if want := "file\nnested\nsingle\n640 981173106\n"; got != want {
			t.Errorf("mv alloc/data -> web/local: got %q, want %q", got, want)
		}
	})

	t.Run("rm -r", func(t *testing.T) {
		got := n.mustSh(t, filepath.Join(a1, "web", "local"), `
			mkdir -p rm/a/b/c rm/empty
			echo x > rm/a/b/c/f
			echo y > rm/a/g
			ln -s a rm/link
			mkfifo rm/a/pipe
			rm -r rm
			test ! -e rm && echo gone
			ls -A | grep -c '^rm$' || true`)
		if want := "gone\n0\n"; got != want {
			t.Errorf("rm -r: got %q, want %q", got, want)
		}
	})

	t.Run("chmod", func(t *testing.T) {
		got := n.mustSh(t, filepath.Join(a1, "alloc", "data"), `
			mkdir chmod-dir chmod-sticky
			touch chmod-file chmod-suid
			chmod 0640 chmod-file
			chmod u+x,g-r chmod-file
			chmod 0750 chmod-dir
			chmod 1777 chmod-sticky
			chmod 4755 chmod-suid
			stat -c '%n %a' chmod-file chmod-dir chmod-sticky chmod-suid`)
		want := "chmod-file 700\nchmod-dir 750\nchmod-sticky 1777\nchmod-suid 4755\n"
		if got != want {
			t.Errorf("chmod: got\n%s\nwant\n%s", got, want)
		}
	})

	// Mode 0000 is a mode like any other, not "unset".
	t.Run("chmod 0000", func(t *testing.T) {
		got := n.mustSh(t, filepath.Join(a1, "alloc", "data"), `
			touch mode-none
			chmod 0000 mode-none
			mkdir -m 0000 mode-none-dir
			stat -c '%n %a' mode-none mode-none-dir`)
		if want := "mode-none 0\nmode-none-dir 0\n"; got != want {
			t.Errorf("mode 0000: got\n%s\nwant\n%s", got, want)
		}
	})

	t.Run("chown", func(t *testing.T) {
		got := n.mustSh(t, filepath.Join(a1, "alloc", "data"), `
			touch chown-file
			mkdir chown-dir
			ln -s chown-file chown-link
			chown nobody chown-file
			chown nobody:nogroup chown-dir
			chown -h nobody:nogroup chown-link
			stat -c '%n %U:%G' chown-file chown-dir chown-link`)
		// chown -h changes the link, not the file it points to.
		want := "chown-file nobody:root\nchown-dir nobody:nogroup\nchown-link nobody:nogroup\n"
		if got != want {
			t.Errorf("chown: got\n%s\nwant\n%s", got, want)
		}
	})

	t.Run("df -T", func(t *testing.T) {
		got := n.mustSh(t, a1, `df -T "$MNT" alloc/data web/local | awk 'NR > 1 { print $2 }'`)
		if want := strings.Repeat(fsType+"\n", 3); got != want {
			t.Errorf("df -T types: got %q, want %q", got, want)
		}
	})

	// Tasks run as other users: nobody may write where a task writes and
	// nowhere else. allow_other and default_permissions make the kernel
	// enforce the mode bits.
	t.Run("as nobody", func(t *testing.T) {
		asNobody := nobodyRunner(t)
		if got, want := n.mustSh(t, a1, "stat -c '%a %U' ."), "755 root\n"; got != want {
			t.Fatalf("allocation root: got %q, want %q", got, want)
		}
		for _, dir := range []string{"web/local", "web/tmp", "alloc/data"} {
			got := n.mustSh(t, a1, asNobody(`echo hello > `+dir+`/by-nobody && cat `+dir+`/by-nobody && stat -c %U:%G `+dir+`/by-nobody`))
			if want := "hello\nnobody:nogroup\n"; got != want {
				t.Errorf("nobody writing in %s: got %q, want %q", dir, got, want)
			}
		}

		r := n.sh(t, a1, asNobody("touch by-nobody"))
		if r.code == 0 || !strings.Contains(r.stderr, "Permission denied") {
			t.Errorf("nobody creating a file in the allocation root: exit %d, %q; want failure with Permission denied", r.code, r.stderr)
		}
		n.mustSh(t, a1, "mkdir -m 0700 alloc/data/root-only")
		r = n.sh(t, a1, asNobody("echo x > alloc/data/root-only/f"))
		if r.code == 0 || !strings.Contains(r.stderr, "Permission denied") {
			t.Errorf("nobody writing into a 0700 root directory: exit %d, %q; want failure with Permission denied", r.code, r.stderr)
		}
		if r := n.sh(t, a1, "test ! -e by-nobody && test ! -e alloc/data/root-only/f"); r.code != 0 {
			t.Errorf("a refused write left a file behind")
		}
	})

	// secrets/ lives in the daemon's memory: what is written there reads
	// back through the mount and is in no file under the data dir.
	t.Run("secrets stay off disk", func(t *testing.T) {
		secret := "secret-" + randomHex(t)
		control := "control-" + randomHex(t)
		got := n.mustSh(t, a1, `
			printf %s `+secret+` > web/secrets/token
			printf %s `+control+` > web/local/control
			cat web/secrets/token`)
		if got != secret {
			t.Errorf("web/secrets/token through the mount: got %q, want %q", got, secret)
		}
		// The control proves the grep can find what is on disk.
		grep := `grep -r -D skip -l -F `
		if r := n.sh(t, a1, grep+control+` "$DATA"`); r.code != 0 {
			t.Fatalf("grep -r for the control in the data dir: exit %d, want 0 (found)\n%s", r.code, r.stderr)
		}
		if r := n.sh(t, a1, grep+secret+` "$DATA"`); r.code != 1 {
			t.Errorf("grep -r for the secret in the data dir: exit %d, want 1 (not found)\n%s%s", r.code, r.stdout, r.stderr)
		}
		if strings.Contains(n.Out.String(), secret) {
			t.Errorf("the daemon's log holds the secret")
		}
	})

	n.stop(t)
}

// TestCrashRestart: after kill -9 the holder keeps the mount; serve,
// started again, takes it over and serves every allocation and every byte
// written before the crash, and a request made meanwhile.
func TestCrashRestart(t *testing.T) {
	fstest.RequireFUSE(t)
	n := startNode(t)
	n.mustCLI(t, "alloc", "create", "a1", "--task", "web")
	n.mustCLI(t, "alloc", "create", "a2", "--task", "db", "--task", "api")
	// Checksums of every file in the volumes that live on disk.
	const sums = `find a1/alloc/data a1/alloc/logs a1/web/local a2/alloc/data a2/db/local a2/api/local a2/api/tmp -type f -print0 | sort -z | xargs -0 sha256sum`
	before := n.mustSh(t, n.mnt, `
		head -c 2097152 /dev/urandom > a1/alloc/data/blob
		echo config > a1/web/local/app.conf
		for i in $(seq 1 100); do echo "log line $i" >> a1/alloc/logs/web.stdout.0; done
		mkdir -p a2/alloc/data/nested/deep
		echo deep > a2/alloc/data/nested/deep/f
		echo db > a2/db/local/db.conf
		echo scratch > a2/api/tmp/scratch
		`+sums)
	if got := strings.Count(before, "\n"); got != 6 {
		t.Fatalf("checksums before the crash: got %d files, want 6\n%s", got, before)
	}
	listBefore := n.mustCLI(t, "alloc", "list")

	n.kill9(t)
	// The holder keeps the connection: a request made while no daemon
	// runs waits for the next one.
	statfs := make(chan error, 1)
	go func() {
		var sfs unix.Statfs_t
		statfs <- unix.Statfs(filepath.Join(n.mnt, "a2"), &sfs)
	}()

	n.Restart(t)
	if err := <-statfs; err != nil {
		t.Errorf("statfs made while no daemon ran: %v, want it answered by the next one", err)
	}
	if c := harness.MountsAt(t, n.mnt); c != 1 {
		t.Errorf("allocfs mounts at %s after restart: got %d, want 1 (the one taken over)", n.mnt, c)
	}
	if got := n.mustCLI(t, "alloc", "list"); got != listBefore {
		t.Errorf("alloc list after restart:\n%s\nwant\n%s", got, listBefore)
	}
	if got := n.mustSh(t, n.mnt, sums); got != before {
		t.Errorf("checksums after restart:\n%s\nwant\n%s", got, before)
	}
	if got, want := n.mustSh(t, n.mnt, `echo "after restart" >> a1/alloc/logs/web.stdout.0 && tail -n 2 a1/alloc/logs/web.stdout.0`), "log line 100\nafter restart\n"; got != want {
		t.Errorf("appending after restart: got %q, want %q", got, want)
	}
	n.stop(t)
}

// makeTree creates dir/tree: nested directories, an empty one, a 0600
// file, a file owned by nobody, random bytes, a symbolic link, and
// nanosecond mtimes on everything.
func makeTree(t *testing.T, n *node, dir string) {
	t.Helper()
	n.mustSh(t, dir, `
		mkdir -p tree/dir/nested/deep tree/emptydir
		printf 'deep file\n' > tree/dir/nested/deep/file.txt
		printf 'only root reads this\n' > tree/dir/secret
		chmod 0600 tree/dir/secret
		printf 'owned by nobody\n' > tree/dir/owned
		chown nobody:nogroup tree/dir/owned
		head -c 100000 /dev/urandom > tree/dir/random.bin
		chmod 0750 tree/dir/nested
		ln -s dir/nested/deep/file.txt tree/link
		find tree -depth -exec touch -h -d '2001-02-03 04:05:06.123456789' {} +`)
}

// treeListing describes every entry under dir, one line each, sorted:
// type, mode, owner, size of regular files, mtime with nanoseconds and
// symbolic link targets. Trees that cp -a or tar made equal list equal.
func treeListing(t *testing.T, n *node, dir string) string {
	t.Helper()
	return n.mustSh(t, dir, `find . \
		\( -type l -printf '%P l %m %u:%g %T@ -> %l\n' \) -o \
		\( -type d -printf '%P d %m %u:%g %T@\n' \) -o \
		\( -type f -printf '%P f %m %u:%g %s %T@\n' \) | sort`)
}

// nobodyRunner returns a function that turns a script into a command line
// running it as nobody:nogroup without supplementary groups.
func nobodyRunner(t *testing.T) func(script string) string {
	t.Helper()
	if _, err := exec.LookPath("setpriv"); err == nil {
		return func(script string) string {
			return "setpriv --reuid=nobody --regid=nogroup --clear-groups sh -c " + q(script)
		}
	}
	if _, err := exec.LookPath("su"); err == nil {
		return func(script string) string {
			return "su -s /bin/sh nobody -c " + q(script)
		}
	}
	fstest.Lacks(t, "neither setpriv (util-linux) nor su is installed")
	return nil
}

// q quotes s for bash.
func q(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func randomHex(t *testing.T) string {
	t.Helper()
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// waitFor polls cond until it holds or d has passed, and reports whether
// it held.
func waitFor(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}
