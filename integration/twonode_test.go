package integration

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/allocfs/allocfs/fs/fstest"
	"github.com/allocfs/allocfs/migrate"
)

// netPair is two network namespaces joined by a veth pair, each end with
// an address: two nodes on one machine.
type netPair struct {
	ns   [2]string
	addr [2]string
}

// newNetPair creates the namespaces and removes them when the test ends.
func newNetPair(t *testing.T) *netPair {
	t.Helper()
	for _, tool := range []string{"ip", "nsenter", "tc"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is needed for the two-node test (apt-get install iproute2 util-linux): %v", tool, err)
		}
	}
	var b [3]byte
	rand.Read(b[:])
	tag := hex.EncodeToString(b[:])
	p := &netPair{
		ns:   [2]string{"afs-" + tag + "-1", "afs-" + tag + "-2"},
		addr: [2]string{fmt.Sprintf("10.201.%d.1", b[0]%250+1), fmt.Sprintf("10.201.%d.2", b[0]%250+1)},
	}
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	t.Cleanup(func() {
		for _, ns := range p.ns {
			exec.Command("ip", "netns", "del", ns).Run()
		}
	})
	va, vb := "afsv"+tag+"a", "afsv"+tag+"b"
	run("ip", "netns", "add", p.ns[0])
	run("ip", "netns", "add", p.ns[1])
	run("ip", "link", "add", va, "type", "veth", "peer", "name", vb)
	run("ip", "link", "set", va, "netns", p.ns[0])
	run("ip", "link", "set", vb, "netns", p.ns[1])
	for i, v := range []string{va, vb} {
		run("ip", "-n", p.ns[i], "addr", "add", p.addr[i]+"/24", "dev", v)
		run("ip", "-n", p.ns[i], "link", "set", v, "up")
		run("ip", "-n", p.ns[i], "link", "set", "lo", "up")
	}
	// A slow link, so that a transfer takes long enough to be cut.
	run("ip", "netns", "exec", p.ns[0], "tc", "qdisc", "add", "dev", va, "root", "tbf", "rate", "40mbit", "burst", "64kb", "latency", "400ms")
	return p
}

func (p *netPair) enter(i int) []string {
	return []string{"nsenter", "--net=/run/netns/" + p.ns[i], "--"}
}

// TestTwoNodes migrates an allocation between two daemons in two network
// namespaces over the wire: a wrong token is refused and leaves nothing;
// the right one brings the data over; a transfer cut halfway (the source
// daemon killed) leaves nothing partial and the retry, once the source is
// back, succeeds.
func TestTwoNodes(t *testing.T) {
	fstest.RequireFUSE(t)
	net := newNetPair(t)
	dir := t.TempDir()
	token, bad := filepath.Join(dir, "token"), filepath.Join(dir, "bad")
	os.WriteFile(token, []byte("cluster-secret-1\n"), 0o600)
	os.WriteFile(bad, []byte("guess\n"), 0o600)
	src := startNodeWith(t, net.enter(0), "--http-addr", net.addr[0]+":4646", "--migrate-token-file", token)
	dst := startNodeWith(t, net.enter(1))
	from := "http://" + net.addr[0] + ":4646"

	src.mustCLI(t, "alloc", "create", "A", "--task", "web")
	sums := src.mustSh(t, src.mnt, `
		head -c 16000000 /dev/urandom > A/alloc/data/blob
		echo "A conf" > A/web/local/conf
		echo "A log" > A/alloc/logs/web.stdout.0
		sha256sum A/alloc/data/blob A/web/local/conf | cut -d' ' -f1`)
	src.mustCLI(t, "alloc", "stop", "A")
	staging := filepath.Join(dst.dataDir, "staging")
	emptyStaging := func(when string) {
		t.Helper()
		if entries, err := os.ReadDir(staging); err != nil || len(entries) != 0 {
			t.Errorf("staging %s: got %v, %v; want empty", when, entries, err)
		}
	}
	check := func(id string) {
		t.Helper()
		got := dst.mustSh(t, dst.mnt, fmt.Sprintf("sha256sum %[1]s/alloc/data/blob %[1]s/web/local/conf | cut -d' ' -f1", id))
		if got != sums {
			t.Errorf("%s's data on the other node: got sums\n%s want\n%s", id, got, sums)
		}
		if _, err := os.Stat(filepath.Join(dst.mnt, id, "alloc/logs/web.stdout.0")); !os.IsNotExist(err) {
			t.Errorf("%s: logs came along (%v); logs are not migrated", id, err)
		}
	}

	r := dst.cli(t, "alloc", "create", "B0", "--task", "web", "--previous", "A", "--migrate", "--from", from, "--token-file", bad)
	if r.code == 0 || !strings.Contains(strings.ToLower(r.stderr), "permission denied") {
		t.Errorf("a wrong token: exit %d, %q; want a refusal (permission denied)", r.code, r.stderr)
	}
	if _, err := os.Stat(filepath.Join(dst.mnt, "B0")); !os.IsNotExist(err) {
		t.Errorf("B0 after a refused fetch: %v, want no such allocation", err)
	}
	emptyStaging("after a refused fetch")

	r = dst.cli(t, "alloc", "create", "B", "--task", "web", "--previous", "A", "--migrate", "--from", from, "--token-file", token)
	if r.code != 0 || !strings.Contains(r.stderr, "snapshot of A: ") || !strings.Contains(r.stderr, "/s)") {
		t.Errorf("fetch of B: exit %d, progress %q; want success and a closing progress line", r.code, r.stderr)
	}
	check("B")
	emptyStaging("after a fetch")

	// Cut halfway: kill the source while it streams, bring it back; the
	// fetch retries with backoff and completes.
	done := make(chan result, 1)
	go func() {
		done <- dst.cli(t, "alloc", "create", "C", "--task", "web", "--previous", "A", "--migrate", "--from", from, "--token-file", token)
	}()
	time.Sleep(time.Second)
	src.kill9(t)
	src.Restart(t)
	r = <-done
	if r.code != 0 {
		t.Fatalf("fetch across a cut connection: exit %d\n%s", r.code, r.stderr)
	}
	// The CLI shows the transfer: the cut attempt, then the retry that
	// completed.
	if !strings.Contains(r.stderr, "interrupted after") || !strings.Contains(r.stderr, "(attempt 2)") {
		t.Errorf("progress of the fetch of C: got %q, want an interrupted attempt and a second one", r.stderr)
	}
	check("C")
	emptyStaging("after a cut and a retry")
	dst.stop(t)
	src.stop(t)
}

// TestNodeSecretMigrateTokens: a node started with its secret admits the
// migrate token Nomad's servers derive from it for the allocation asked,
// and nothing else: not the token of another allocation, not the secret.
func TestNodeSecretMigrateTokens(t *testing.T) {
	fstest.RequireFUSE(t)
	dir := t.TempDir()
	const secret = "2c0c6f55-3f2a-4c4e-9f33-6c1d8c0a9b17"
	secretFile := filepath.Join(dir, "secret")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(secretFile, []byte(secret+"\n"), 0o600))
	tokenFor := func(id string) string {
		p := filepath.Join(dir, "token-"+id)
		must(os.WriteFile(p, []byte(migrate.NodeSecretToken(secret).Derive(id)), 0o600))
		return p
	}
	addr := freeAddr(t)
	src := startNodeWith(t, nil, "--http-addr", addr, "--node-secret-file", secretFile)
	dst := startNode(t)
	src.mustCLI(t, "alloc", "create", "A", "--task", "web")
	src.mustCLI(t, "alloc", "create", "Other", "--task", "web")
	must(os.WriteFile(filepath.Join(src.mnt, "A/alloc/data/f"), []byte("from A"), 0o644))
	src.mustCLI(t, "alloc", "stop", "A")
	from := "http://" + addr

	secretAsToken := filepath.Join(dir, "secret-as-token")
	must(os.WriteFile(secretAsToken, []byte(secret), 0o600))
	for name, tok := range map[string]string{"another allocation's token": tokenFor("Other"), "the secret itself": secretAsToken} {
		r := dst.cli(t, "alloc", "create", "B", "--task", "web", "--previous", "A", "--migrate", "--from", from, "--token-file", tok)
		if r.code == 0 || !strings.Contains(strings.ToLower(r.stderr), "permission denied") {
			t.Errorf("%s: exit %d, %q; want permission denied", name, r.code, r.stderr)
		}
	}
	dst.mustCLI(t, "alloc", "create", "B", "--task", "web", "--previous", "A", "--migrate", "--from", from, "--token-file", tokenFor("A"))
	if b, err := os.ReadFile(filepath.Join(dst.mnt, "B/alloc/data/f")); err != nil || string(b) != "from A" {
		t.Errorf("B's data: %q, %v; want A's", b, err)
	}
}
