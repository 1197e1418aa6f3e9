package fs

// Real-workload benchmarks: what a task feels on a real source
// tree, Go's own $(go env GOROOT)/src (about 12.8k files, 140 MB), run by
// the tools a task runs (tar, git, rm, du, grep, sqlite3) on every side of
// bench_test.go but the floors, which have no backing files to set up. One
// op is one whole workload; each benchmark reports a rate (files/s or
// txn/s) and the seconds per op (s/op), which scripts/benchratio.sh turns
// into side/native and native/side ratios, so higher is better for both.
//
// The tools run as child processes: this process serves the mount and the
// loopback, so a tool blocked on them never holds up the Go runtime here.
// Untimed setup goes through a side's backing directory, as in
// bench_test.go, so that the mount's fuse-req/op counts the workload and
// not the setup.

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

const (
	workGrepWord   = "func"   // a word in most of cmd/go's files
	workGrepDir    = "cmd/go" // below src
	workSqliteTxns = 1000
	workOutputTail = 4 << 10 // bytes of a failed tool's output in the failure message
)

// workTree is a tarball of Go's source tree, on the filesystem the
// benchmark's sides are on, so that reading it costs every side the same.
type workTree struct {
	tarball string // holds src/...
	// entries is how many files tar stores for src, directories and src
	// itself included: what an unpack creates and rm -rf removes.
	entries int
	// grepFiles is how many regular files grep reads below workGrepDir.
	grepFiles int
}

// newWorkTree packs $(go env GOROOT)/src into a tarball for benchmark b,
// untimed, and removes it when b ends. It skips b where the tree or tar is
// missing. The tarball is made per benchmark rather than once per process
// because only the top-level benchmark's cleanup can remove it: the
// package's TestMain has no hook for it.
func newWorkTree(b *testing.B) *workTree {
	b.Helper()
	requireTools(b, "tar", "go")
	out, err := exec.Command("go", "env", "GOROOT").Output()
	if err != nil {
		b.Skipf("the workload benchmarks need Go's source tree: go env GOROOT: %v", err)
	}
	goroot := strings.TrimSpace(string(out))
	src := filepath.Join(goroot, "src")
	tree := &workTree{}
	if tree.entries, _, err = countTree(src); err != nil {
		b.Skipf("the workload benchmarks need Go's source tree: %v", err)
	}
	if _, tree.grepFiles, err = countTree(filepath.Join(src, workGrepDir)); err != nil {
		b.Skipf("the grep benchmark needs %s of Go's source tree: %v", workGrepDir, err)
	}
	dir := b.TempDir()
	if d := os.Getenv("ALLOCFS_BENCH_DIR"); d != "" {
		if dir, err = os.MkdirTemp(d, "allocfs-work-"); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { os.RemoveAll(dir) })
	}
	tree.tarball = filepath.Join(dir, "src.tar")
	runTool(b, "", "", "tar", "-C", goroot, "-cf", tree.tarball, "src")
	return tree
}

// countTree counts every entry below root, root included, and the regular
// files among them.
func countTree(root string) (entries, regular int, err error) {
	err = filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		entries++
		if d.Type().IsRegular() {
			regular++
		}
		return nil
	})
	return entries, regular, err
}

// requireTools skips b unless every tool is on PATH.
func requireTools(b *testing.B, tools ...string) {
	b.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			b.Skipf("%s is missing: %v", tool, err)
		}
	}
}

// workEnv is the tools' environment: the C locale, so that grep and git do
// the same work whatever the caller's locale, and a git identity and
// configuration of its own, so that no user or system config changes what
// git does.
func workEnv() []string {
	return append(os.Environ(),
		"LC_ALL=C",
		"GIT_CONFIG_NOSYSTEM=1",
		"GIT_CONFIG_GLOBAL=/dev/null",
		"GIT_AUTHOR_NAME=allocfs bench",
		"GIT_AUTHOR_EMAIL=bench@allocfs.invalid",
		"GIT_COMMITTER_NAME=allocfs bench",
		"GIT_COMMITTER_EMAIL=bench@allocfs.invalid",
	)
}

// gitArgs prefixes a git command with the configuration every run needs:
// safe.directory because the benchmark runs as root on files that may
// show another owner through a side; no automatic gc or maintenance,
// which a commit of 12k loose objects would otherwise start in the
// background, in the middle of the next measurement and of the cleanup.
func gitArgs(args ...string) []string {
	return append([]string{
		"-c", "safe.directory=*",
		"-c", "gc.auto=0",
		"-c", "maintenance.auto=false",
		"-c", "init.defaultBranch=main",
	}, args...)
}

// runTool runs name with args in dir (the current directory if empty),
// with stdin as its input, and returns its output; it fails b with the
// command, the error and the tail of the output if the tool fails. The
// caller controls the timer.
func runTool(b *testing.B, dir, stdin, name string, args ...string) string {
	b.Helper()
	cmd := exec.CommandContext(b.Context(), name, args...)
	cmd.Dir = dir
	cmd.Env = workEnv()
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	if err := cmd.Run(); err != nil {
		b.StopTimer()
		tail := out.Bytes()
		if len(tail) > workOutputTail {
			tail = tail[len(tail)-workOutputTail:]
		}
		b.Fatalf("%s %s (in %q): %v\n%s", name, strings.Join(args, " "), dir, err, tail)
	}
	return out.String()
}

// gitTool runs git with gitArgs in dir, as runTool does.
func gitTool(b *testing.B, dir string, args ...string) string {
	b.Helper()
	return runTool(b, dir, "", "git", gitArgs(args...)...)
}

// extractTree unpacks the tarball into dir, untimed, and checks that the
// whole tree arrived.
func (t *workTree) extractTree(b *testing.B, dir string) {
	b.Helper()
	runTool(b, "", "", "tar", "-xf", t.tarball, "-C", dir)
	t.checkTree(b, filepath.Join(dir, "src"))
}

// checkTree fails b unless src holds every entry of the tarball.
func (t *workTree) checkTree(b *testing.B, src string) {
	b.Helper()
	n, _, err := countTree(src)
	if err != nil {
		b.Fatal(err)
	}
	if n != t.entries {
		b.Fatalf("%q holds %d entries, want the tarball's %d", src, n, t.entries)
	}
}

// reportWork reports count items per second of the timed part as unit,
// and the seconds of one op.
func reportWork(b *testing.B, count int, unit string) {
	reportRate(b, count, unit)
	b.ReportMetric(b.Elapsed().Seconds()/float64(b.N), "s/op")
}

// opDirs makes a fresh directory for op i on side s, through its backing
// directory, and returns its path as the workload sees it and as setup
// sees it.
func opDirs(b *testing.B, s benchSide, i int) (dir, backing string) {
	b.Helper()
	name := "op" + strconv.Itoa(i)
	backing = filepath.Join(s.backing, name)
	if err := os.Mkdir(backing, 0o755); err != nil {
		b.Fatal(err)
	}
	return filepath.Join(s.dir, name), backing
}

// BenchmarkWorkUntar unpacks the tree with tar -x into an empty directory
// after drop_caches, as an artifact unpack into a task's local/ does. The
// op is tar alone: the writeback after it is not waited for.
func BenchmarkWorkUntar(b *testing.B) {
	tree := newWorkTree(b)
	env := newBenchEnv(b, benchConfig{})
	env.run(b, func(b *testing.B, s benchSide) {
		for i := 0; i < b.N; i++ {
			b.StopTimer()
			dir, backing := opDirs(b, s, i)
			dropCaches(b)
			b.StartTimer()
			runTool(b, "", "", "tar", "-xf", tree.tarball, "-C", dir)
			b.StopTimer()
			tree.checkTree(b, filepath.Join(backing, "src"))
		}
		reportWork(b, tree.entries, "files/s")
	})
}

// BenchmarkWorkGitCommit runs git add -A and git commit of the whole tree
// in a fresh repository (git init, untimed) after drop_caches.
func BenchmarkWorkGitCommit(b *testing.B) {
	requireTools(b, "git")
	tree := newWorkTree(b)
	env := newBenchEnv(b, benchConfig{})
	env.run(b, func(b *testing.B, s benchSide) {
		for i := 0; i < b.N; i++ {
			b.StopTimer()
			dir, backing := opDirs(b, s, i)
			tree.extractTree(b, backing)
			gitTool(b, filepath.Join(backing, "src"), "init", "-q")
			dropCaches(b)
			repo := filepath.Join(dir, "src")
			b.StartTimer()
			gitTool(b, repo, "add", "-A")
			gitTool(b, repo, "commit", "-q", "-m", "x")
			b.StopTimer()
			backingRepo := filepath.Join(backing, "src")
			if got := strings.TrimSpace(gitTool(b, backingRepo, "rev-list", "--count", "HEAD")); got != "1" {
				b.Fatalf("%q has %s commits after the commit, want 1", backingRepo, got)
			}
		}
		reportWork(b, tree.entries, "files/s")
	})
}

// BenchmarkWorkRmRf removes the tree with rm -rf after drop_caches.
func BenchmarkWorkRmRf(b *testing.B) {
	requireTools(b, "rm")
	tree := newWorkTree(b)
	env := newBenchEnv(b, benchConfig{})
	env.run(b, func(b *testing.B, s benchSide) {
		for i := 0; i < b.N; i++ {
			b.StopTimer()
			dir, backing := opDirs(b, s, i)
			tree.extractTree(b, backing)
			dropCaches(b)
			b.StartTimer()
			runTool(b, "", "", "rm", "-rf", filepath.Join(dir, "src"))
			b.StopTimer()
			if _, err := os.Lstat(filepath.Join(backing, "src")); !errors.Is(err, os.ErrNotExist) {
				b.Fatalf("after rm -rf the tree is still there: %v", err)
			}
		}
		reportWork(b, tree.entries, "files/s")
	})
}

// BenchmarkWorkDuCold runs du -s over the tree after drop_caches.
func BenchmarkWorkDuCold(b *testing.B) {
	requireTools(b, "du")
	tree := newWorkTree(b)
	env := newBenchEnv(b, benchConfig{})
	env.run(b, func(b *testing.B, s benchSide) {
		b.StopTimer()
		tree.extractTree(b, s.backing)
		src := filepath.Join(s.dir, "src")
		for i := 0; i < b.N; i++ {
			b.StopTimer()
			dropCaches(b)
			b.StartTimer()
			out := runTool(b, "", "", "du", "-s", src)
			b.StopTimer()
			// du prints "<KiB>\t<dir>"; a tree of 140 MB is not empty.
			kib, _, _ := strings.Cut(out, "\t")
			if n, err := strconv.ParseInt(kib, 10, 64); err != nil || n <= 0 {
				b.Fatalf("du -s %q printed %q, want a positive size", src, out)
			}
		}
		reportWork(b, tree.entries, "files/s")
	})
}

// BenchmarkWorkGitStatus runs git status in a repository holding the
// committed tree, warm: the repository is made and committed untimed on
// the backing directory, then git status runs once untimed through the
// side (which also refreshes the index where the side shows other inode
// numbers than the backing filesystem) and once timed.
func BenchmarkWorkGitStatus(b *testing.B) {
	requireTools(b, "git")
	tree := newWorkTree(b)
	env := newBenchEnv(b, benchConfig{})
	env.run(b, func(b *testing.B, s benchSide) {
		b.StopTimer()
		tree.extractTree(b, s.backing)
		backingRepo := filepath.Join(s.backing, "src")
		gitTool(b, backingRepo, "init", "-q")
		gitTool(b, backingRepo, "add", "-A")
		gitTool(b, backingRepo, "commit", "-q", "-m", "x")
		repo := filepath.Join(s.dir, "src")
		for i := 0; i < b.N; i++ {
			b.StopTimer()
			settle()
			if out := gitTool(b, repo, "status", "--porcelain"); out != "" {
				b.Fatalf("%q is not clean after its commit:\n%s", repo, out)
			}
			b.StartTimer()
			gitTool(b, repo, "status")
			b.StopTimer()
		}
		reportWork(b, tree.entries, "files/s")
	})
}

// BenchmarkWorkGrepCold runs grep -rl over the tree's cmd/go after
// drop_caches: every file is read.
func BenchmarkWorkGrepCold(b *testing.B) {
	requireTools(b, "grep")
	tree := newWorkTree(b)
	env := newBenchEnv(b, benchConfig{})
	env.run(b, func(b *testing.B, s benchSide) {
		b.StopTimer()
		tree.extractTree(b, s.backing)
		dir := filepath.Join(s.dir, "src", workGrepDir)
		for i := 0; i < b.N; i++ {
			b.StopTimer()
			dropCaches(b)
			b.StartTimer()
			out := runTool(b, "", "", "grep", "-rl", workGrepWord, dir)
			b.StopTimer()
			if n := strings.Count(out, "\n"); n == 0 || n > tree.grepFiles {
				b.Fatalf("grep -rl %s %q listed %d files, want 1 to %d", workGrepWord, dir, n, tree.grepFiles)
			}
		}
		reportWork(b, tree.grepFiles, "files/s")
	})
}

// BenchmarkWorkSqlite runs 1,000 INSERT statements in one sqlite3 process
// on a database in the side's directory, each its own transaction
// (autocommit, the default rollback journal and synchronous mode): every
// one creates, syncs and deletes a journal and syncs the database.
func BenchmarkWorkSqlite(b *testing.B) {
	requireTools(b, "sqlite3")
	env := newBenchEnv(b, benchConfig{})
	var inserts strings.Builder
	for j := 0; j < workSqliteTxns; j++ {
		fmt.Fprintf(&inserts, "INSERT INTO t(v) VALUES('row %04d of the allocfs workload benchmark');\n", j)
	}
	env.run(b, func(b *testing.B, s benchSide) {
		for i := 0; i < b.N; i++ {
			b.StopTimer()
			name := "op" + strconv.Itoa(i) + ".db"
			backingDB := filepath.Join(s.backing, name)
			runTool(b, "", "CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT);\n", "sqlite3", "-batch", "-bail", backingDB)
			settle()
			b.StartTimer()
			runTool(b, "", inserts.String(), "sqlite3", "-batch", "-bail", filepath.Join(s.dir, name))
			b.StopTimer()
			out := runTool(b, "", "SELECT count(*) FROM t;\n", "sqlite3", "-batch", "-bail", backingDB)
			if got := strings.TrimSpace(out); got != strconv.Itoa(workSqliteTxns) {
				b.Fatalf("%q holds %s rows, want %d", backingDB, got, workSqliteTxns)
			}
		}
		reportWork(b, workSqliteTxns, "txn/s")
	})
}
