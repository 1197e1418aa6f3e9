package allocdirtest

import (
	"bytes"
	"encoding/json"
	"strings"
	"sync"
	"testing"
)

// SyncBuffer is a bytes.Buffer that goroutines or a child process write
// to while the test reads it: a log output, a command's stdout.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns what was written so far.
func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// JSONLines decodes the JSON log lines written so far (hclog's
// JSONFormat), failing t on one that is not JSON, and forgets them.
func (s *SyncBuffer) JSONLines(t testing.TB) []map[string]any {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(s.b.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		out = append(out, m)
	}
	s.b.Reset()
	return out
}
