package integration

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/allocfs/allocfs/fs/fstest"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// scrapeOf is one scrape of a node's /v1/metrics, parsed.
type scrapeOf map[string]*dto.MetricFamily

// metricsNode is an fsNode (its metrics on the socket and, behind
// apiToken, on TCP) that measures usage every 100 ms, so that a test sees
// a write at once.
type metricsNode struct{ *fsNode }

func startMetricsNode(t *testing.T) *metricsNode {
	t.Helper()
	return &metricsNode{startFSNode(t, "--metrics-usage-interval", "100ms")}
}

// tokenHeader is the header that carries token, none for "".
func tokenHeader(token string) map[string]string {
	if token == "" {
		return nil
	}
	return map[string]string{"X-Nomad-Token": token}
}

// parse parses a body in Prometheus's text format, with the legacy name
// rules every Prometheus accepts.
func parse(t *testing.T, body string) scrapeOf {
	t.Helper()
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("the metrics do not parse: %v\n%s", err, body)
	}
	return fams
}

// scrape GETs the node's metrics on its socket and parses them.
func (n *metricsNode) scrape(t *testing.T) scrapeOf {
	t.Helper()
	a := n.get(t, false, "/v1/metrics", nil)
	if a.code != http.StatusOK {
		t.Fatalf("GET /v1/metrics on the socket: %d %s", a.code, a.body)
	}
	return parse(t, a.body)
}

// value is the value of the series of family name with labels (the
// count, for a histogram), or -1 when there is none.
func (s scrapeOf) value(name string, labels map[string]string) float64 {
	fam, ok := s[name]
	if !ok {
		return -1
	}
next:
	for _, m := range fam.Metric {
		for k, v := range labels {
			found := false
			for _, l := range m.Label {
				found = found || l.GetName() == k && l.GetValue() == v
			}
			if !found {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue()
		case m.Gauge != nil:
			return m.Gauge.GetValue()
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount())
		}
	}
	return -1
}

// waitFor scrapes until cond holds, for up to harness's bound.
func (n *metricsNode) waitFor(t *testing.T, what string, cond func(scrapeOf) bool) scrapeOf {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		s := n.scrape(t)
		if cond(s) {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 30 s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// series names a series for the failure messages.
func series(name string, labels map[string]string) string {
	return fmt.Sprintf("%s%v", name, labels)
}

// TestMetrics scrapes a real daemon and checks that each family is there
// and moves when the thing it counts happens: an allocation's usage after
// a write, the FUSE LOOKUP histogram after lstats through the mount, a
// snapshot migration, the copy-up of a file it left below, a collection,
// a follower; and that the text parses every time.
func TestMetrics(t *testing.T) {
	fstest.RequireFUSE(t)
	n := startMetricsNode(t)
	s := n.scrape(t)
	for _, name := range []string{
		"allocfs_fuse_request_duration_seconds", "allocfs_fuse_passthrough", "allocfs_fuse_passthrough_lost",
		"allocfs_fuse_file_opens_total", "allocfs_followers", "allocfs_allocs",
		"allocfs_copyup_duration_seconds", "allocfs_copyup_bytes_total",
		"allocfs_migration_duration_seconds", "allocfs_migration_fetch_duration_seconds",
		"allocfs_migration_fetch_bytes_total", "allocfs_migration_fetch_attempts_total",
		"allocfs_gc_collections_total", "allocfs_gc_pass_duration_seconds", "allocfs_gc_pressure",
		"allocfs_gc_pinned_skips_total", "allocfs_gc_orphan_layers_removed_total", "allocfs_flatten_merges_total",
		"allocfs_backing_size_bytes", "allocfs_backing_free_bytes", "allocfs_backing_files_free",
		"allocfs_alloc_usage_failures_total", "go_goroutines", "process_open_fds",
	} {
		if _, ok := s[name]; !ok {
			t.Errorf("no %s in the first scrape", name)
		}
	}
	if pt := s.value("allocfs_fuse_passthrough", nil); pt != 0 && pt != 1 {
		t.Errorf("allocfs_fuse_passthrough = %g, want 0 or 1", pt)
	}
	// The collector's first pass runs as serve starts.
	n.waitFor(t, "the collector's first pass", func(s scrapeOf) bool {
		return s.value("allocfs_gc_pass_duration_seconds", map[string]string{"trigger": "interval"}) >= 1
	})

	t.Run("usage", func(t *testing.T) {
		n.mustCLI(t, "alloc", "create", "a1", "--task", "web")
		n.mustSh(t, n.mnt, `head -c 1000 /dev/zero > a1/alloc/data/f; mkdir a1/alloc/data/d; echo hi > a1/alloc/data/d/g`)
		upper := map[string]string{"alloc_id": "a1", "volume": "alloc/data", "layer": "upper"}
		s := n.waitFor(t, "a1's usage after its writes", func(s scrapeOf) bool {
			return s.value("allocfs_alloc_bytes", upper) == 1003 && s.value("allocfs_alloc_files", upper) == 3
		})
		if got := s.value("allocfs_alloc_status", map[string]string{"alloc_id": "a1", "status": "running"}); got != 1 {
			t.Errorf("a1 running: %g, want 1", got)
		}
		if got := s.value("allocfs_allocs", map[string]string{"status": "running"}); got != 1 {
			t.Errorf("running allocations: %g, want 1", got)
		}
	})

	t.Run("fuse", func(t *testing.T) {
		lookup := map[string]string{"op": "LOOKUP"}
		// A missing name is answered as a negative entry, which is no
		// error; removing a directory that holds a file is one.
		notEmpty := map[string]string{"op": "RMDIR", "errno": "ENOTEMPTY"}
		before := n.scrape(t)
		opens := before.value("allocfs_fuse_file_opens_total", map[string]string{"mode": "passthrough"}) +
			before.value("allocfs_fuse_file_opens_total", map[string]string{"mode": "daemon"})
		const names = 20
		for i := range names {
			p := filepath.Join(n.mnt, "a1", "alloc", "data", fmt.Sprintf("missing-%d", i))
			if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("lstat %s: %v, want not-exist", p, err)
			}
		}
		n.mustSh(t, n.mnt, `cat a1/alloc/data/d/g >/dev/null; ! rmdir a1/alloc/data/d 2>/dev/null`)
		n.waitFor(t, "the lookups counted", func(s scrapeOf) bool {
			return s.value("allocfs_fuse_request_duration_seconds", lookup) >= before.value("allocfs_fuse_request_duration_seconds", lookup)+names
		})
		s := n.waitFor(t, "the failed rmdir counted", func(s scrapeOf) bool {
			return s.value("allocfs_fuse_request_errors_total", notEmpty) >= max(before.value("allocfs_fuse_request_errors_total", notEmpty), 0)+1
		})
		after := s.value("allocfs_fuse_file_opens_total", map[string]string{"mode": "passthrough"}) +
			s.value("allocfs_fuse_file_opens_total", map[string]string{"mode": "daemon"})
		if after <= opens {
			t.Errorf("file opens: %g after a cat, was %g", after, opens)
		}
	})

	t.Run("migration and copy-up", func(t *testing.T) {
		snapshotOK := map[string]string{"kind": "snapshot", "result": "ok"}
		file := map[string]string{"type": "file"}
		before := n.scrape(t)
		n.mustCLI(t, "alloc", "stop", "a1")
		n.mustCLI(t, "alloc", "create", "a2", "--task", "web", "--previous", "a1", "--migrate", "--migrate-mode", "snapshot")
		s := n.scrape(t)
		if got, was := s.value("allocfs_migration_duration_seconds", snapshotOK), before.value("allocfs_migration_duration_seconds", snapshotOK); got != was+1 {
			t.Errorf("%s: %g after a snapshot migration, was %g", series("allocfs_migration_duration_seconds", snapshotOK), got, was)
		}
		if got, was := s.value("allocfs_copyup_duration_seconds", file), before.value("allocfs_copyup_duration_seconds", file); got != was {
			t.Errorf("file copy-ups: %g after a migration alone, was %g: a migration copies nothing", got, was)
		}
		n.mustSh(t, n.mnt, `echo appended >> a2/alloc/data/f`)
		s = n.waitFor(t, "the copy-up of a2's first write to f", func(s scrapeOf) bool {
			return s.value("allocfs_copyup_duration_seconds", file) >= before.value("allocfs_copyup_duration_seconds", file)+1
		})
		if got, was := s.value("allocfs_copyup_bytes_total", nil), before.value("allocfs_copyup_bytes_total", nil); got < was+1000 {
			t.Errorf("copied-up bytes: %g after copying up a 1000-byte file, was %g", got, was)
		}
		n.waitFor(t, "a2's usage: a1's layer below, the copy in its own", func(s scrapeOf) bool {
			return s.value("allocfs_alloc_bytes", map[string]string{"alloc_id": "a2", "volume": "alloc/data", "layer": "lower"}) == 1003 &&
				s.value("allocfs_alloc_bytes", map[string]string{"alloc_id": "a2", "volume": "alloc/data", "layer": "upper"}) == 1009
		})
	})

	t.Run("followers", func(t *testing.T) {
		n.mustSh(t, n.mnt, `echo started >> a2/alloc/logs/web.stdout.0`)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://allocfs/v1/client/fs/logs/a2?task=web&type=stdout&follow=true", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := n.socket.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		n.waitFor(t, "a follower counted", func(s scrapeOf) bool { return s.value("allocfs_followers", nil) == 1 })
		cancel()
		n.waitFor(t, "the follower gone", func(s scrapeOf) bool { return s.value("allocfs_followers", nil) == 0 })
	})

	t.Run("gc", func(t *testing.T) {
		requested := map[string]string{"reason": "requested", "result": "ok"}
		before := n.scrape(t)
		n.mustCLI(t, "gc", "a1")
		s := n.scrape(t)
		if got, was := s.value("allocfs_gc_collections_total", requested), before.value("allocfs_gc_collections_total", requested); got != was+1 {
			t.Errorf("%s: %g after gc a1, was %g", series("allocfs_gc_collections_total", requested), got, was)
		}
		trigger := map[string]string{"trigger": "requested"}
		if got, was := s.value("allocfs_gc_pass_duration_seconds", trigger), before.value("allocfs_gc_pass_duration_seconds", trigger); got != was+1 {
			t.Errorf("requested collector passes: %g after gc a1, was %g", got, was)
		}
		if got := s.value("allocfs_alloc_status", map[string]string{"alloc_id": "a1"}); got != -1 {
			t.Errorf("a1 still has a status series after it was collected")
		}
	})

	t.Run("formats", func(t *testing.T) {
		a := n.get(t, false, "/v1/metrics?format=prometheus", nil)
		if a.code != http.StatusOK {
			t.Errorf("format=prometheus: %d %s", a.code, a.body)
		}
		parse(t, a.body)
		if a := n.get(t, false, "/v1/metrics?format=json", nil); a.code != http.StatusBadRequest || !strings.Contains(a.body, "Prometheus text format") {
			t.Errorf("format=json: %d %q, want 400 naming the format served", a.code, a.body)
		}
		// The control API behind the metrics' mux still answers.
		if a := n.get(t, false, "/v1/status", nil); a.code != http.StatusOK {
			t.Errorf("the control API next to the metrics: %d %s", a.code, a.body)
		}
	})

	t.Run("tcp", func(t *testing.T) {
		for _, tok := range []string{"", "wrong"} {
			if a := n.get(t, true, "/v1/metrics", tokenHeader(tok)); a.code != http.StatusForbidden {
				t.Errorf("metrics over TCP with token %q: %d %q, want 403", tok, a.code, a.body)
			}
		}
		a := n.get(t, true, "/v1/metrics", tokenHeader(apiToken))
		if a.code != http.StatusOK {
			t.Fatalf("metrics over TCP with the token: %d %s", a.code, a.body)
		}
		if s := parse(t, a.body); s.value("allocfs_alloc_status", map[string]string{"alloc_id": "a2", "status": "running"}) != 1 {
			t.Errorf("metrics over TCP do not show a2 running")
		}
		// The control API stays off TCP.
		if a := n.get(t, true, "/v1/status", tokenHeader(apiToken)); a.code != http.StatusNotFound {
			t.Errorf("the control API over TCP: %d, want 404", a.code)
		}
	})
}
