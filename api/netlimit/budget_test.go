package netlimit

import (
	"strings"
	"syscall"
	"testing"
)

// TestSplitFDs: the budget of a few limits, and the invariants every
// budget keeps: the shares add up to the limit, the reserve is at least
// half of it and at least minReserve, every share can hold a client.
func TestSplitFDs(t *testing.T) {
	for _, tc := range []struct {
		limit int
		want  Budget
	}{
		// prlimit --nofile=1024:1024, the case.
		{1024, Budget{Limit: 1024, Reserve: 512, UnixConns: 64, TCPConns: 320, Streams: 64}},
		{minReserve + minNetwork, Budget{Limit: 320, Reserve: 256, UnixConns: 8, TCPConns: 40, Streams: 8}},
		// A systemd default (LimitNOFILE=524288): the clients' share is
		// capped, the mount keeps the rest.
		{524288, Budget{Limit: 524288, Reserve: 524288 - maxNetwork, UnixConns: 2048, TCPConns: 10240, Streams: 2048}},
	} {
		got, err := SplitFDs(tc.limit)
		if err != nil {
			t.Errorf("SplitFDs(%d): %v", tc.limit, err)
			continue
		}
		if got != tc.want {
			t.Errorf("SplitFDs(%d):\ngot  %+v\nwant %+v", tc.limit, got, tc.want)
		}
	}
	for limit := minReserve + minNetwork; limit <= 1<<20; limit = limit*3/2 + 1 {
		b, err := SplitFDs(limit)
		if err != nil {
			t.Fatalf("SplitFDs(%d): %v", limit, err)
		}
		if sum := b.Reserve + b.UnixConns + b.TCPConns + b.Streams*fdsPerStream; sum != limit {
			t.Errorf("SplitFDs(%d) = %+v: shares add up to %d", limit, b, sum)
		}
		if b.Reserve < limit/2 || b.Reserve < minReserve {
			t.Errorf("SplitFDs(%d) = %+v: reserve below half the limit or below %d", limit, b, minReserve)
		}
		if b.UnixConns < 1 || b.TCPConns < 1 || b.Streams < 1 {
			t.Errorf("SplitFDs(%d) = %+v: a share with no room", limit, b)
		}
	}
}

// TestSplitFDsTooLow: a limit that leaves clients less than minNetwork is
// refused with the limit to raise it to.
func TestSplitFDsTooLow(t *testing.T) {
	for _, limit := range []int{0, 64, 256, minReserve + minNetwork - 1} {
		b, err := SplitFDs(limit)
		if err == nil {
			t.Errorf("SplitFDs(%d) = %+v, nil error; want a refusal", limit, b)
			continue
		}
		if b != (Budget{}) {
			t.Errorf("SplitFDs(%d) refused but returned %+v", limit, b)
		}
		if !strings.Contains(err.Error(), "at least 320") {
			t.Errorf("SplitFDs(%d): %q does not say how far to raise the limit", limit, err)
		}
	}
}

// TestRaiseNoFile: a soft limit below the hard one is raised to it; one
// equal to it is left alone. The test's own limit is restored after.
func TestRaiseNoFile(t *testing.T) {
	var orig syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &orig); err != nil {
		t.Fatal(err)
	}
	if orig.Max < 512 {
		t.Skipf("hard open files limit %d: too low to lower the soft one for the test", orig.Max)
	}
	t.Cleanup(func() {
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &orig); err != nil {
			t.Errorf("restore the open files limit: %v", err)
		}
	})
	low := syscall.Rlimit{Cur: 256, Max: orig.Max}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	was, soft, err := RaiseNoFile()
	if err != nil {
		t.Fatal(err)
	}
	if was != low || soft != orig.Max {
		t.Errorf("RaiseNoFile from %+v: was %+v, soft %d; want was %+v, soft %d", low, was, soft, low, orig.Max)
	}
	var now syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &now); err != nil {
		t.Fatal(err)
	}
	if now.Cur != orig.Max || now.Max != orig.Max {
		t.Errorf("limit after RaiseNoFile: %+v, want soft and hard %d", now, orig.Max)
	}
	// Equal already: nothing to do.
	was, soft, err = RaiseNoFile()
	if err != nil || soft != orig.Max || was != now {
		t.Errorf("RaiseNoFile at the hard limit: was %+v, soft %d, %v; want %+v, %d, nil", was, soft, err, now, orig.Max)
	}
}
