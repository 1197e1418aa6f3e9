package integration

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/allocfs/allocfs/api"
	"github.com/allocfs/allocfs/fs/fstest"
	"github.com/allocfs/allocfs/integration/harness"
	"github.com/allocfs/allocfs/integration/nomadreplay"
	nomadapi "github.com/hashicorp/nomad/api"
	"golang.org/x/sys/unix"
)

// fakeNomadAgent answers GET /v1/allocation/<id> with Nomad's own
// api.Allocation, marshalled, for the allocations in sizes (their task
// group's ephemeral_disk.size, MB), when asked with token: no Nomad agent
// can run here, and its client library's wire types are the closest
// real artifact.
func fakeNomadAgent(t *testing.T, token string) (string, func(id string, mb int)) {
	t.Helper()
	var mu sync.Mutex
	sizes := map[string]int{}
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Nomad-Token") != token {
			http.Error(w, "Permission denied", http.StatusForbidden)
			return
		}
		id, ok := strings.CutPrefix(r.URL.Path, "/v1/allocation/")
		mu.Lock()
		size, known := sizes[id]
		mu.Unlock()
		if r.Method != http.MethodGet || !ok || !known {
			http.Error(w, "alloc not found", http.StatusNotFound)
			return
		}
		group := "cache"
		json.NewEncoder(w).Encode(nomadapi.Allocation{ID: id, TaskGroup: group,
			Job:                &nomadapi.Job{TaskGroups: []*nomadapi.TaskGroup{{Name: &group, EphemeralDisk: &nomadapi.EphemeralDisk{SizeMB: &size}}}},
			AllocatedResources: &nomadapi.AllocatedResources{Shared: nomadapi.AllocatedSharedResources{DiskMB: int64(size)}},
		})
	}))
	t.Cleanup(ts.Close)
	return ts.URL, func(id string, mb int) {
		mu.Lock()
		sizes[id] = mb
		mu.Unlock()
	}
}

// waitDisk waits until allocation id's status shows a disk limit of
// want bytes, and returns its status.
func waitDisk(t *testing.T, n *node, id string, want int64) map[string]any {
	t.Helper()
	deadline := time.Now().Add(harness.Timeout)
	for {
		var st struct {
			Disk *struct {
				LimitBytes int64 `json:"limit_bytes"`
				UsedBytes  int64 `json:"used_bytes"`
			} `json:"disk"`
		}
		out := n.mustCLI(t, "alloc", "status", "-json", id)
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			t.Fatalf("alloc status -json: %v\n%s", err, out)
		}
		if st.Disk != nil && st.Disk.LimitBytes == want {
			var all map[string]any
			json.Unmarshal([]byte(out), &all)
			return all
		}
		if time.Now().After(deadline) {
			t.Fatalf("allocation %s: disk %+v, want a limit of %d bytes\n%s", id, st.Disk, want, n.Out)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestNomadSizesThroughTheMount runs the replay of Nomad's client on a
// btrfs data dir with disk limits: the allocation its mkdir makes gets
// its task group's ephemeral_disk.size from the Nomad API server of the
// test, a task writing past it gets EDQUOT while another allocation
// writes on, df inside the allocation shows the size, and the sticky
// disk Nomad moves to the replacement moves its usage with it.
func TestNomadSizesThroughTheMount(t *testing.T) {
	fstest.RequireFUSE(t)
	img := fstest.Image(t, "btrfs", 700, "")
	nomadAddr, place := fakeNomadAgent(t, "acl-secret")
	tokenFile := filepath.Join(t.TempDir(), "nomad-token")
	if err := os.WriteFile(tokenFile, []byte("acl-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	root, err := os.MkdirTemp("", "allocfs-it-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	n := &node{dataDir: filepath.Join(img, "data"), mnt: filepath.Join(root, "mnt"), socket: filepath.Join(root, "allocfs.sock")}
	n.Daemon = harness.StartDaemon(t, &harness.Daemon{DataDir: n.dataDir, Mount: n.mnt, Socket: n.socket,
		Args: []string{"--enable-quotas", "--nomad-addr", nomadAddr, "--nomad-token-file", tokenFile}})
	waitLog(t, n.Daemon, "disk limits are enforced")
	if out := n.mustCLI(t, "status"); !strings.Contains(out, "enforced (btrfs qgroups on btrfs)") {
		t.Errorf("allocfs status:\n%s", out)
	}

	c := &nomadreplay.Client{AllocDir: n.mnt, MountsDir: filepath.Join(root, "mounts"), Logf: t.Logf}
	t.Cleanup(func() { detachBelow(t, c.AllocDir, c.MountsDir) })
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	a, other := nomadID(), nomadID()
	place(a, 40)
	place(other, 300)
	for _, id := range []string{a, other} {
		if err := c.Build(id); err != nil {
			t.Fatalf("Build %s: %v", id, err)
		}
		if _, err := c.BuildTask(id, "web", nomadreplay.None, 1000); err != nil {
			t.Fatalf("BuildTask %s: %v", id, err)
		}
	}
	waitDisk(t, n, a, 40<<20)
	waitDisk(t, n, other, 300<<20)

	var sfs unix.Statfs_t
	if err := unix.Statfs(filepath.Join(c.Dir(a), "web", "local"), &sfs); err != nil {
		t.Fatal(err)
	}
	if got := int64(sfs.Blocks) * sfs.Frsize; got != 40<<20 {
		t.Errorf("df in the allocation: %d bytes, want its 40 MiB", got)
	}
	// A task fills its disk, by the data and by its logs.
	wrote, err := fstest.WriteUntil(filepath.Join(c.Dir(a), "alloc", "data", "fill"), 0o644, 30<<20)
	if err != nil {
		t.Fatalf("30 MiB into a 40 MiB allocation: %d bytes, %v", wrote, err)
	}
	wrote, err = fstest.WriteUntil(filepath.Join(c.Dir(a), "alloc", "logs", "web.stdout.0"), 0o644, 30<<20)
	if !errors.Is(err, unix.EDQUOT) || wrote > 10<<20 {
		t.Fatalf("30 MiB more into the logs: %d bytes, %v; want EDQUOT within the 10 MiB left", wrote, err)
	}
	if wrote, err := fstest.WriteUntil(filepath.Join(c.Dir(other), "alloc", "data", "fill"), 0o644, 64<<20); err != nil {
		t.Fatalf("the other allocation: %d bytes, %v", wrote, err)
	}
	os.Remove(filepath.Join(c.Dir(a), "alloc", "logs", "web.stdout.0"))

	// The replacement: Nomad's sticky disk moves by rename, and with it
	// what the data holds.
	b := nomadID()
	place(b, 100)
	if err := c.Build(b); err != nil {
		t.Fatal(err)
	}
	if err := c.Move(a, b, []string{"web"}); err != nil {
		t.Fatalf("Move: %v", err)
	}
	unix.Sync()
	st := waitDisk(t, n, b, 100<<20)
	used := int64(st["disk"].(map[string]any)["used_bytes"].(float64))
	if used < 30<<20 {
		t.Errorf("the replacement holds %d bytes after taking over 30 MiB of data", used)
	}
	if data, err := os.Stat(filepath.Join(c.Dir(b), "alloc", "data", "fill")); err != nil || data.Size() != 30<<20 {
		t.Errorf("the moved data: %v, %v", data, err)
	}
}

// TestQuotaHealth: disk limits asked for (--enable-quotas) where the data
// dir cannot keep them fail the node's quota check, naming what would;
// on btrfs the check passes and names the mechanism.
func TestQuotaHealth(t *testing.T) {
	fstest.RequireFUSE(t)
	n := startNodeWith(t, nil, "--enable-quotas")
	code, h := n.health(t)
	var quota *api.HealthCheck
	for i := range h.Checks {
		if h.Checks[i].Name == "quota" {
			quota = &h.Checks[i]
		}
	}
	if code == http.StatusOK || quota == nil || quota.OK || !strings.Contains(quota.Detail, "--enable-quotas is set") || !strings.Contains(quota.Detail, "btrfs") {
		t.Fatalf("health with --enable-quotas on a data dir that cannot: %d %+v", code, h)
	}
	waitLog(t, n.Daemon, "disk limits are not enforced")

	img := fstest.Image(t, "btrfs", 300, "")
	root, err := os.MkdirTemp("", "allocfs-it-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	b := &node{dataDir: filepath.Join(img, "data"), mnt: filepath.Join(root, "mnt"), socket: filepath.Join(root, "allocfs.sock")}
	b.Daemon = harness.StartDaemon(t, &harness.Daemon{DataDir: b.dataDir, Mount: b.mnt, Socket: b.socket, Args: []string{"--enable-quotas", "--default-disk-mb", "64"}})
	code, h = b.health(t)
	if code != http.StatusOK || !h.Client.OK {
		t.Fatalf("health of a node with disk limits: %d %+v", code, h)
	}
	for _, c := range h.Checks {
		if c.Name == "quota" && (!c.OK || !strings.Contains(c.Detail, "btrfs qgroups")) {
			t.Fatalf("quota check on btrfs: %+v", c)
		}
	}
	b.mustCLI(t, "alloc", "create", "--task", "web", "a1")
	if out := b.mustCLI(t, "alloc", "status", "a1"); !strings.Contains(out, "of 64.0 MiB (btrfs qgroups)") {
		t.Fatalf("alloc status of an allocation with the default limit:\n%s", out)
	}
}
