package migrate_test

import (
	"net/http"
	"sync"
	"testing"

	"github.com/allocfs/allocfs/migrate"
)

// fetchRecord is a FetchObserver that keeps the reports it was given.
type fetchRecord struct {
	mu      sync.Mutex
	reports []migrate.FetchReport
}

func (r *fetchRecord) Fetched(rep migrate.FetchReport) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reports = append(r.reports, rep)
}

// TestFetchTellsTheObserver: a fetch cut once and then received is one
// report of two attempts, whose bytes are the half the cut attempt got
// and the whole snapshot; a refused one is a report with its error.
func TestFetchTellsTheObserver(t *testing.T) {
	t.Parallel()
	alloc := newSource(t)
	data := snapshotBytes(t, alloc)
	half := len(data) / 2
	src := newSourceServer(t, alloc, func(real http.Handler, n int, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			cutAfter(t, w, data, half)
			return
		}
		real.ServeHTTP(w, r)
	})
	rec := &fetchRecord{}
	opts := fetchOptions(t, src.srv.URL)
	opts.Observer = rec
	res, err := migrate.Fetch(t.Context(), opts)
	if err != nil {
		t.Fatal(err)
	}
	opts.Token = "wrong"
	if _, err := migrate.Fetch(t.Context(), opts); err == nil {
		t.Fatal("a fetch with a wrong token succeeded")
	}
	if len(rec.reports) != 2 {
		t.Fatalf("%d reports, want 2: %+v", len(rec.reports), rec.reports)
	}
	ok, refused := rec.reports[0], rec.reports[1]
	if ok.Err != nil || ok.Attempts != 2 || ok.Bytes != int64(half)+res.Bytes || ok.Duration <= 0 {
		t.Errorf("report of a fetch cut once: %+v, want no error, 2 attempts, %d bytes and a duration", ok, int64(half)+res.Bytes)
	}
	if refused.Err == nil || refused.Attempts != 1 || refused.Bytes != 0 {
		t.Errorf("report of a refused fetch: %+v, want its error, 1 attempt and no bytes", refused)
	}
}

// TestFetchDefaultObserver: a fetch whose options name no observer tells
// the process's default one, until it is turned off. Not parallel: the
// default is the process's.
func TestFetchDefaultObserver(t *testing.T) {
	src := newSourceServer(t, newSource(t), nil)
	rec := &fetchRecord{}
	migrate.SetDefaultFetchObserver(rec)
	defer migrate.SetDefaultFetchObserver(nil)
	opts := fetchOptions(t, src.srv.URL)
	if _, err := migrate.Fetch(t.Context(), opts); err != nil {
		t.Fatal(err)
	}
	migrate.SetDefaultFetchObserver(nil)
	opts.StagingDir = t.TempDir()
	if _, err := migrate.Fetch(t.Context(), opts); err != nil {
		t.Fatal(err)
	}
	if len(rec.reports) != 1 || rec.reports[0].Err != nil || rec.reports[0].Bytes == 0 {
		t.Errorf("the default observer got %+v, want one report of a fetch that received bytes", rec.reports)
	}
}
