//go:build linux

package main

import (
	"io"
	"slices"
	"testing"
)

// TestServeAllowSuid: --allow-suid is off unless given, and a reload
// that changes it names it as waiting for the next start, since the
// mount's nosuid is set when it is made.
func TestServeAllowSuid(t *testing.T) {
	e := &env{stdout: io.Discard, stderr: io.Discard, getenv: func(string) string { return "" }}
	base := []string{"--data-dir", t.TempDir(), "--live-restart=false"}
	off, err := parseServeArgs(e, base)
	if err != nil {
		t.Fatal(err)
	}
	on, err := parseServeArgs(e, append(base, "--allow-suid"))
	if err != nil {
		t.Fatal(err)
	}
	if off.allowSuid || !on.allowSuid {
		t.Errorf("allowSuid: %v without the flag, %v with it; want false, true", off.allowSuid, on.allowSuid)
	}
	if got := restartOnly(off, on); !slices.Equal(got, []string{"allow-suid"}) {
		t.Errorf("a reload that turns --allow-suid on waits for %v, want [allow-suid]", got)
	}
}
