package store

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/allocfs/allocfs/allocdir"
)

// observed is an Observer that keeps the migrations it was told of; what
// the collector tells one is package gc's to test.
type observed struct {
	mu         sync.Mutex
	migrations []string // kind/ok or kind/error
}

func result(err error) string {
	if err != nil {
		return "error"
	}
	return "ok"
}

func (o *observed) Migrated(kind MigrationKind, d time.Duration, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.migrations = append(o.migrations, string(kind)+"/"+result(err))
}

func (o *observed) Collected(GCReason, error)   {}
func (o *observed) CollectorPass(CollectorPass) {}

// TestObserverMigrations: every migration into a new allocation reaches
// the observer with its kind, the refused ones as errors.
func TestObserverMigrations(t *testing.T) {
	s := openTestStore(t, filepath.Join(t.TempDir(), "data"))
	obs := &observed{}
	s.SetObserver(obs)
	web := []allocdir.Task{{Name: "web"}}
	mustCreate(t, s, "a", "web")
	if _, err := s.Create("b", web, CreateOptions{Previous: "a", Migration: MigrationAdopt}); !errors.Is(err, ErrNotTerminal) {
		t.Fatalf("migration from a running allocation: %v, want ErrNotTerminal", err)
	}
	if _, err := s.Stop("a"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Create("b", web, CreateOptions{Previous: "a", Migration: MigrationSnapshot}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Stop("b"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Create("c", web, CreateOptions{Previous: "b", Migration: MigrationAdopt}); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(s.StagingDir(), "fetch-1", "alloc/data")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Create("d", web, CreateOptions{Previous: "remote", Migration: MigrationRemote, Imported: map[string]string{"alloc/data": dir}}); err != nil {
		t.Fatal(err)
	}
	want := []string{"adopt/error", "snapshot/ok", "adopt/ok", "remote/ok"}
	if !reflect.DeepEqual(obs.migrations, want) {
		t.Errorf("migrations observed: %v, want %v", obs.migrations, want)
	}
}
