package integration

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/allocfs/allocfs/api"
	"github.com/allocfs/allocfs/fs/fstest"
	"github.com/allocfs/allocfs/integration/harness"
	"github.com/allocfs/allocfs/internal/fusectl"
	"github.com/allocfs/allocfs/internal/mountinfo"
)

// socketClient is an HTTP client of the node's unix socket.
func (n *node) socketClient() *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", n.socket)
		},
	}}
}

// scrape GETs the node's metrics on its unix socket and parses them.
func (n *node) scrape(t *testing.T) scrapeOf {
	t.Helper()
	resp, err := n.socketClient().Get("http://allocfs/v1/metrics")
	if err != nil {
		t.Fatalf("GET /v1/metrics: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /v1/metrics: %d %s %v", resp.StatusCode, b, err)
	}
	return parse(t, string(b))
}

// health asks the node's unix socket for /v1/agent/health.
func (n *node) health(t *testing.T) (int, api.Health) {
	t.Helper()
	resp, err := n.socketClient().Get("http://allocfs" + api.HealthPath)
	if err != nil {
		t.Fatalf("GET %s: %v", api.HealthPath, err)
	}
	defer resp.Body.Close()
	var h api.Health
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil {
		t.Fatalf("GET %s: the body is not a health answer: %v", api.HealthPath, err)
	}
	return resp.StatusCode, h
}

// TestAgentHealth: a serving node is healthy, mount, passthrough, store,
// memory and quota alike, on a host that never mounted fusectl; once its FUSE
// connection is aborted (what a dead mount is), the same endpoint answers
// 500 and names the mount.
func TestAgentHealth(t *testing.T) {
	if fstest.WithFusectl(t, false) {
		return
	}
	fstest.RequireFUSE(t)
	n := startNode(t)
	code, h := n.health(t)
	if code != http.StatusOK || !h.Client.OK || len(h.Checks) != 5 {
		t.Fatalf("health of a serving node: %d %+v, want 200, ok and five checks (mount, passthrough, store, memory, quota)", code, h)
	}
	for _, c := range h.Checks {
		if !c.OK {
			t.Errorf("check %s failed on a serving node: %s", c.Name, c.Detail)
		}
	}

	mounts, err := mountinfo.Read("")
	if err != nil {
		t.Fatal(err)
	}
	device := ""
	for _, m := range mounts {
		if m.MountPoint == n.mnt && m.FSType == harness.FSType {
			device = m.Device
		}
	}
	if device == "" {
		t.Fatalf("no allocfs mount at %s", n.mnt)
	}
	if want := "FUSE connection " + strings.TrimPrefix(device, "0:") + ", "; !strings.HasPrefix(h.Checks[0].Detail, want) || !strings.HasSuffix(h.Checks[0].Detail, " requests waiting") {
		t.Errorf("the mount check says %q, want %q and how many requests wait", h.Checks[0].Detail, want)
	}
	if !strings.Contains(n.Out.String(), "private, detached instance") {
		t.Errorf("serve did not say where it reads its FUSE connection from:\n%s", n.Out)
	}
	conn, err := fusectl.Conn(device)
	if err != nil {
		t.Fatal(err)
	}
	ctl, err := fusectl.Shared()
	if err != nil {
		t.Fatal(err)
	}
	if err := ctl.Abort(conn); err != nil {
		t.Fatalf("abort the FUSE connection: %v", err)
	}
	for deadline := time.Now().Add(harness.Timeout); ; time.Sleep(20 * time.Millisecond) {
		code, h = n.health(t)
		if code == http.StatusInternalServerError {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("health after the connection was aborted: %d %+v, want 500", code, h)
		}
	}
	if h.Client.OK || !strings.HasPrefix(h.Client.Message, "mount: ") {
		t.Errorf("health of a dead mount: %+v, want the mount named", h.Client)
	}
}
