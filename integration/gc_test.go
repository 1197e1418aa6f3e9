package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/allocfs/allocfs/fs/fstest"
)

// TestGCFromTheCLIRespectsPinsAndFlattens: `allocfs gc` goes through the
// node's one collector: an allocation whose snapshot is streaming to
// another node (its pin) is not collected while the stream lasts, every
// other stopped allocation is, and once the stream is over the next gc
// takes it and the running allocation's stack of snapshot layers is
// flattened to at most four lowers, with nothing lost.
func TestGCFromTheCLIRespectsPinsAndFlattens(t *testing.T) {
	fstest.RequireFUSE(t)
	token := filepath.Join(t.TempDir(), "migrate-token")
	if err := os.WriteFile(token, []byte("gc-pin-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	n := startNodeWith(t, nil, "--http-addr", addr, "--migrate-token-file", token, "--gc-interval", "0")
	const gens = 7
	for i := range gens {
		args := []string{"alloc", "create", fmt.Sprintf("a%d", i), "--task", "web"}
		if i > 0 {
			args = append(args, "--previous", fmt.Sprintf("a%d", i-1), "--migrate", "--migrate-mode", "snapshot")
		}
		n.mustCLI(t, args...)
		data := filepath.Join(n.mnt, fmt.Sprintf("a%d", i), "alloc", "data")
		if err := os.WriteFile(filepath.Join(data, fmt.Sprintf("gen%d", i)), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		if i == 3 {
			// Enough that a reader who stops reading holds the stream,
			// and with it the pin, for as long as it likes.
			big := strings.Repeat("snapshot bytes ", 4<<20)
			if err := os.WriteFile(filepath.Join(data, "big"), []byte(big), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if i < gens-1 {
			n.mustCLI(t, "alloc", "stop", fmt.Sprintf("a%d", i))
		}
	}
	if l := dataLowers(t, n, "a6"); l <= 4 {
		t.Fatalf("a6 stacks %d lowers before any gc, want more than 4", l)
	}

	req, err := http.NewRequest(http.MethodGet, "http://"+addr+"/v1/client/allocation/a3/snapshot", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Nomad-Token", "gc-pin-token")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("snapshot of a3: %s", resp.Status)
	}
	// Read a little, then stop: the daemon blocks writing the rest.
	if _, err := io.ReadFull(resp.Body, make([]byte, 4096)); err != nil {
		t.Fatal(err)
	}
	out := n.mustCLI(t, "gc")
	for _, id := range []string{"a0", "a1", "a2", "a4", "a5"} {
		if !strings.Contains(out, "collected allocation "+id+"\n") {
			t.Errorf("gc with a3's snapshot streaming: %q does not say %s was collected", out, id)
		}
	}
	if strings.Contains(out, "a3") {
		t.Errorf("gc collected a3 while its snapshot streamed: %q", out)
	}
	if _, err := os.Stat(filepath.Join(n.mnt, "a3", "alloc", "data", "gen3")); err != nil {
		t.Errorf("a3's files, while its snapshot streams: %v", err)
	}
	resp.Body.Close()

	// The stream ends on the daemon's side when its next write fails.
	deadline := time.Now().Add(30 * time.Second)
	for {
		out = n.mustCLI(t, "gc")
		if strings.Contains(out, "collected allocation a3") || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !strings.Contains(out, "collected allocation a3") {
		t.Fatalf("gc after a3's snapshot stream ended: %q, want a3 collected", out)
	}
	if l := dataLowers(t, n, "a6"); l > 4 {
		t.Errorf("after gc, a6 stacks %d lowers: the collection did not flatten", l)
	}
	for i := range gens {
		if _, err := os.Stat(filepath.Join(n.mnt, "a6", "alloc", "data", fmt.Sprintf("gen%d", i))); err != nil {
			t.Errorf("gen%d through a6 after the flatten: %v", i, err)
		}
	}
}

// dataLowers is how many lower layers id's alloc/data stacks, from
// `allocfs alloc status -json`.
func dataLowers(t *testing.T, n *node, id string) int {
	t.Helper()
	var st struct {
		Volumes map[string]struct {
			Lowers []string `json:"lowers"`
		} `json:"volumes"`
	}
	if err := json.Unmarshal([]byte(n.mustCLI(t, "alloc", "status", "-json", id)), &st); err != nil {
		t.Fatal(err)
	}
	return len(st.Volumes["alloc/data"].Lowers)
}
