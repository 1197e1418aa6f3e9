// Package storetest holds the helpers that the store's tests, the
// collector's (package gc) and the FUSE tree's share: the tree's tests
// build layers through a mount and then look at the store, and the
// store's tests cannot import the tree. It imports none of them, so that
// all may import it.
package storetest

import (
	"os"
	"path/filepath"
	"sort"
	"testing"

	"github.com/allocfs/allocfs/allocdir"
)

// Must fails the test at once on err.
func Must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// Value returns v, failing the test at once on err: Value(t)(s.Get(id)).
func Value[T any](t testing.TB) func(v T, err error) T {
	return func(v T, err error) T {
		t.Helper()
		Must(t, err)
		return v
	}
}

// ErrOnly drops the value of a call that returns one with an error.
func ErrOnly[T any](_ T, err error) error { return err }

// MustWrite writes content to the file p with mode, creating the
// directories above it.
func MustWrite(t testing.TB, p, content string, mode os.FileMode) {
	t.Helper()
	Must(t, os.MkdirAll(filepath.Dir(p), 0o755))
	Must(t, os.WriteFile(p, []byte(content), mode))
}

// DirNames lists the names in dir, sorted; an empty directory gives an
// empty, non-nil list.
func DirNames(t testing.TB, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("ReadDir(%q): %v", dir, err)
	}
	out := []string{}
	for _, e := range entries {
		out = append(out, e.Name())
	}
	sort.Strings(out)
	return out
}

// Tasks returns tasks of the given names, with no secrets size or user.
func Tasks(names ...string) []allocdir.Task {
	out := make([]allocdir.Task, len(names))
	for i, n := range names {
		out[i] = allocdir.Task{Name: n}
	}
	return out
}
