package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/allocfs/allocfs/allocdir/allocdirtest"
	"github.com/allocfs/allocfs/api"
	"github.com/allocfs/allocfs/api/fsapi"
)

// TestTailOfABusyStream: with -tail on a stream that never goes quiet (a
// task logging every 50 ms, sent as frames as fast), the backlog is still
// cut to its last lines and printed within maxHold of its first data,
// and what follows is printed as it comes.
func TestTailOfABusyStream(t *testing.T) {
	pr, pw := io.Pipe()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	go func() {
		enc := json.NewEncoder(pw)
		for i := 0; ctx.Err() == nil; i++ {
			if err := enc.Encode(fsapi.Frame{Data: fmt.Appendf(nil, "line %d\n", i)}); err != nil {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		pw.Close()
	}()
	var out allocdirtest.SyncBuffer
	done := make(chan error, 1)
	go func() { done <- copyLogs(ctx, &out, api.NewFrameReader(pr), 3) }()
	// Well before the context ends, which releases the backlog too.
	deadline := time.Now().Add(2 * time.Second)
	for out.String() == "" && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	first := out.String()
	if first == "" {
		t.Fatal("nothing printed 2s after the first data of a stream that never went quiet")
	}
	if lines := strings.Split(strings.TrimSuffix(first, "\n"), "\n"); len(lines) > 3+4 || lines[0] == "line 0" {
		t.Errorf("the first output of -tail -n 3: %q, want the backlog cut to its last lines", first)
	}
	cancel()
	pr.Close()
	<-done
}
