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
