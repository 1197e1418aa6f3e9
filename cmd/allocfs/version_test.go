package main

import (
	"strings"
	"testing"
)

// TestBuildDetailsRevision: a build without a VCS stamp (go test's, or
// -buildvcs=false) shows the revision the Makefile linked in.
func TestBuildDetailsRevision(t *testing.T) {
	defer func(old string) { revision = old }(revision)
	revision = ""
	if got := buildDetails(); strings.Contains(got, "rev ") {
		t.Errorf("without a revision: %q names one", got)
	}
	revision = "0123456789ab"
	if got := buildDetails(); !strings.HasPrefix(got, "rev 0123456789ab, go") {
		t.Errorf("with a linked revision: %q, want it first", got)
	}
}
