package metrics

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/allocfs/allocfs/allocdir/allocdirtest"
	"github.com/allocfs/allocfs/fs/store"
	"github.com/allocfs/allocfs/migrate"
	"github.com/hashicorp/go-hclog"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// families is a scrape, parsed.
type families map[string]*dto.MetricFamily

// scrape GETs the handler at target and parses the answer as the text
// format, with the legacy name rules (which every Prometheus accepts).
func scrape(t *testing.T, h http.Handler, target string) families {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, target, nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("GET %s: %d %s", target, rec.Code, rec.Body)
	}
	if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, "text/plain; version=0.0.4") {
		t.Errorf("GET %s: Content-Type %q, want the text format's", target, ct)
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(rec.Body)
	if err != nil {
		t.Fatalf("GET %s: the answer does not parse: %v", target, err)
	}
	return fams
}

// find returns the metric of family name whose labels include want, or
// nil.
func (f families) find(name string, want map[string]string) *dto.Metric {
	fam, ok := f[name]
	if !ok {
		return nil
	}
next:
	for _, m := range fam.Metric {
		for k, v := range want {
			found := false
			for _, l := range m.Label {
				if l.GetName() == k && l.GetValue() == v {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		return m
	}
	return nil
}

// value returns the value of a counter or gauge (the count of a
// histogram), and -1 when there is no such metric.
func (f families) value(name string, labels map[string]string) float64 {
	m := f.find(name, labels)
	switch {
	case m == nil:
		return -1
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount())
	}
	return -1
}

// testLogger writes to the test's log; see allocdirtest.Logger.
var testLogger = allocdirtest.Logger

// TestHandlerFormats: the text format, whatever the Accept header asks
// for, with or without Nomad's format=prometheus; any other format is a
// 400 that says what is served, and only GET and HEAD are answered.
func TestHandlerFormats(t *testing.T) {
	m := New(testLogger(t))
	h := m.Handler()
	for _, target := range []string{Path, Path + "?format=prometheus"} {
		fams := scrape(t, h, target)
		if _, ok := fams["go_goroutines"]; !ok {
			t.Errorf("GET %s: no go_goroutines: the Go collector is not registered", target)
		}
		if _, ok := fams["process_open_fds"]; !ok {
			t.Errorf("GET %s: no process_open_fds: the process collector is not registered", target)
		}
	}
	req := httptest.NewRequest(http.MethodGet, Path, nil)
	req.Header.Set("Accept", "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if ct := rec.Header().Get("Content-Type"); rec.Code != http.StatusOK || !strings.HasPrefix(ct, "text/plain") {
		t.Errorf("a scraper asking for protobuf: %d %q, want 200 and the text format", rec.Code, ct)
	}
	for _, tc := range []struct {
		method, target string
		code           int
		body           string
	}{
		{http.MethodGet, Path + "?format=json", http.StatusBadRequest, `unsupported format "json"`},
		{http.MethodGet, Path + "?format=", http.StatusOK, ""},
		{http.MethodPost, Path, http.StatusMethodNotAllowed, "answers GET"},
		{http.MethodHead, Path, http.StatusOK, ""},
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(tc.method, tc.target, nil))
		if rec.Code != tc.code || !strings.Contains(rec.Body.String(), tc.body) {
			t.Errorf("%s %s: %d %q, want %d and %q", tc.method, tc.target, rec.Code, rec.Body, tc.code, tc.body)
		}
	}
}

// TestFUSESeries: each request is one observation of its opcode's
// histogram; errors count by opcode and errno; an opcode past the table
// is OTHER; opcodes never seen have no series.
func TestFUSESeries(t *testing.T) {
	m := New(testLogger(t))
	f := m.FUSE()
	for range 3 {
		f.Request(1, 30*time.Microsecond, 0)
	}
	f.Request(1, 2*time.Millisecond, syscall.ENOENT)
	f.Request(4096, time.Microsecond, syscall.EIO)
	f.Request(22, time.Microsecond, syscall.ENODATA)
	fams := scrape(t, m.Handler(), Path)
	const durations = "allocfs_fuse_request_duration_seconds"
	lookup := fams.find(durations, map[string]string{"op": "LOOKUP"})
	if lookup == nil {
		t.Fatalf("no %s{op=LOOKUP}", durations)
	}
	if n, sum := lookup.Histogram.GetSampleCount(), lookup.Histogram.GetSampleSum(); n != 4 || sum < 0.00209 || sum > 0.00211 {
		t.Errorf("LOOKUP: %d requests taking %gs, want 4 taking 0.00209s", n, sum)
	}
	for _, b := range lookup.Histogram.Bucket {
		if b.GetUpperBound() == 50e-6 && b.GetCumulativeCount() != 3 {
			t.Errorf("LOOKUP: %d requests within 50µs, want 3", b.GetCumulativeCount())
		}
	}
	if n := fams.value(durations, map[string]string{"op": "OTHER"}); n != 1 {
		t.Errorf("an opcode past the table: %g requests of op OTHER, want 1", n)
	}
	if fams.find(durations, map[string]string{"op": "GETATTR"}) != nil {
		t.Errorf("a series for GETATTR, which no request had")
	}
	const errs = "allocfs_fuse_request_errors_total"
	for _, want := range []map[string]string{
		{"op": "LOOKUP", "errno": "ENOENT"},
		{"op": "OTHER", "errno": "EIO"},
		{"op": "GETXATTR", "errno": "ENODATA"},
	} {
		if n := fams.value(errs, want); n != 1 {
			t.Errorf("%s%v = %g, want 1", errs, want, n)
		}
	}
	if n := len(fams[errs].GetMetric()); n != 3 {
		t.Errorf("%d error series, want 3: a success was counted as an error", n)
	}
}

// TestCopyUpSeries: copy-ups count by type, bytes are the files' sizes.
func TestCopyUpSeries(t *testing.T) {
	m := New(testLogger(t))
	m.CopyUps().CopiedUp(syscall.S_IFREG, 4096, time.Millisecond)
	m.CopyUps().CopiedUp(syscall.S_IFDIR, 0, time.Microsecond)
	m.CopyUps().CopiedUp(syscall.S_IFLNK, 0, time.Microsecond)
	fams := scrape(t, m.Handler(), Path)
	for typ, want := range map[string]float64{"file": 1, "dir": 1, "other": 1} {
		if n := fams.value("allocfs_copyup_duration_seconds", map[string]string{"type": typ}); n != want {
			t.Errorf("copy-ups of type %s: %g, want %g", typ, n, want)
		}
	}
	if n := fams.value("allocfs_copyup_bytes_total", nil); n != 4096 {
		t.Errorf("copied-up bytes: %g, want 4096", n)
	}
}

// TestStoreSeries: migrations by kind and result, collections by reason
// and result, passes by trigger, the pressure of the last timer pass and
// the counts a pass carries.
func TestStoreSeries(t *testing.T) {
	m := New(testLogger(t))
	s := m.Store()
	fams := scrape(t, m.Handler(), Path)
	if n := fams.value("allocfs_migration_duration_seconds", map[string]string{"kind": "snapshot", "result": "ok"}); n != 0 {
		t.Errorf("before any migration: %g snapshot migrations, want a series at 0", n)
	}
	s.Migrated(store.MigrationSnapshot, time.Millisecond, nil)
	s.Migrated(store.MigrationAdopt, time.Millisecond, errors.New("refused"))
	s.Migrated(store.MigrationRemote, time.Second, nil)
	s.Collected(store.GCDisk, nil)
	s.Collected(store.GCRequested, nil)
	s.Collected(store.GCRequested, errors.New("layers left"))
	s.CollectorPass(store.CollectorPass{Pressure: store.GCDisk, Pinned: 2, Swept: 3, Merges: 1, Duration: time.Millisecond})
	s.CollectorPass(store.CollectorPass{Requested: true, Duration: time.Millisecond})
	fams = scrape(t, m.Handler(), Path)
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"allocfs_migration_duration_seconds", map[string]string{"kind": "snapshot", "result": "ok"}, 1},
		{"allocfs_migration_duration_seconds", map[string]string{"kind": "adopt", "result": "error"}, 1},
		{"allocfs_migration_duration_seconds", map[string]string{"kind": "adopt", "result": "ok"}, 0},
		{"allocfs_migration_duration_seconds", map[string]string{"kind": "remote", "result": "ok"}, 1},
		{"allocfs_gc_collections_total", map[string]string{"reason": "disk", "result": "ok"}, 1},
		{"allocfs_gc_collections_total", map[string]string{"reason": "requested", "result": "ok"}, 1},
		{"allocfs_gc_collections_total", map[string]string{"reason": "requested", "result": "error"}, 1},
		{"allocfs_gc_collections_total", map[string]string{"reason": "max_allocs", "result": "ok"}, 0},
		{"allocfs_gc_pass_duration_seconds", map[string]string{"trigger": "interval"}, 1},
		{"allocfs_gc_pass_duration_seconds", map[string]string{"trigger": "requested"}, 1},
		{"allocfs_gc_pressure", map[string]string{"reason": "disk"}, 1},
		{"allocfs_gc_pressure", map[string]string{"reason": "inodes"}, 0},
		{"allocfs_gc_pinned_skips_total", nil, 2},
		{"allocfs_gc_orphan_layers_removed_total", nil, 3},
		{"allocfs_flatten_merges_total", nil, 1},
	} {
		if got := fams.value(c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %g, want %g", c.name, c.labels, got, c.want)
		}
	}
	// A requested pass says nothing of the pressure; the next timer
	// pass does.
	s.CollectorPass(store.CollectorPass{Duration: time.Millisecond})
	fams = scrape(t, m.Handler(), Path)
	if got := fams.value("allocfs_gc_pressure", map[string]string{"reason": "disk"}); got != 0 {
		t.Errorf("pressure after a pass under every threshold: disk %g, want 0", got)
	}
}

// TestFetchSeries: fetches by result, their bytes and attempts.
func TestFetchSeries(t *testing.T) {
	m := New(testLogger(t))
	m.Fetches().Fetched(migrate.FetchReport{Attempts: 2, Bytes: 1000, Duration: time.Second})
	m.Fetches().Fetched(migrate.FetchReport{Attempts: 1, Err: errors.New("403")})
	fams := scrape(t, m.Handler(), Path)
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"allocfs_migration_fetch_duration_seconds", map[string]string{"result": "ok"}, 1},
		{"allocfs_migration_fetch_duration_seconds", map[string]string{"result": "error"}, 1},
		{"allocfs_migration_fetch_bytes_total", nil, 1000},
		{"allocfs_migration_fetch_attempts_total", nil, 3},
	} {
		if got := fams.value(c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %g, want %g", c.name, c.labels, got, c.want)
		}
	}
}

// BenchmarkFUSERequest is what the metrics add to one FUSE request: the
// two clock reads fs/transport makes around it and the observation, on
// one reader (serial) and on every CPU at once into the same opcode's
// histogram (parallel), as the readers of a busy mount do.
func BenchmarkFUSERequest(b *testing.B) {
	f := New(hclog.NewNullLogger()).FUSE()
	b.Run("serial", func(b *testing.B) {
		for b.Loop() {
			start := time.Now()
			f.Request(1, time.Since(start), 0)
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				start := time.Now()
				f.Request(1, time.Since(start), 0)
			}
		})
	})
}
