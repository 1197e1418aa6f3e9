package metrics

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/fs/fstest"
	"github.com/allocfs/allocfs/fs/store"
	"github.com/allocfs/allocfs/fs/store/record"
	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"
)

// BenchmarkAllocUsage measures what reading one allocation's usage
// costs, from the quota accounting (a few sysfs reads, which
// allocfs_alloc_bytes does at each scrape for an allocation with a
// limit) and by the walk of its layers (what the series cost before, and
// still cost for an allocation without one), for 1, 10,000 and, with
// ALLOCFS_BENCH_FILES=1000000, a million files, on a btrfs image with
// quotas:
//
//	go test -run '^$' -bench BenchmarkAllocUsage -benchtime 20x ./metrics
func BenchmarkAllocUsage(b *testing.B) {
	counts := []int{1, 10000}
	if n, err := strconv.Atoi(os.Getenv("ALLOCFS_BENCH_FILES")); err == nil && n > 0 {
		counts = append(counts, n)
	}
	mnt := fstest.Image(b, "btrfs", 8192, "")
	s, err := store.OpenWith(hclog.NewNullLogger(), filepath.Join(mnt, "data"), store.Options{Quotas: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	for _, n := range counts {
		id := fmt.Sprintf("files-%d", n)
		st, err := s.Create(id, []allocdir.Task{{Name: "web"}}, store.CreateOptions{Limit: record.Limit{Bytes: 4 << 30}})
		if err != nil {
			b.Fatal(err)
		}
		data := s.LayerPath(st.Volumes["alloc/data"].Upper)
		for i := 0; i < n; i++ {
			dir := filepath.Join(data, strconv.Itoa(i/1000))
			if i%1000 == 0 {
				if err := os.Mkdir(dir, 0o755); err != nil {
					b.Fatal(err)
				}
			}
			if err := os.WriteFile(filepath.Join(dir, strconv.Itoa(i)), []byte("x"), 0o644); err != nil {
				b.Fatal(err)
			}
		}
		unix.Sync()
		b.Run(fmt.Sprintf("accounting/files=%d", n), func(b *testing.B) {
			for b.Loop() {
				if _, ok, err := s.Usage(id); err != nil || !ok {
					b.Fatal(ok, err)
				}
			}
		})
		b.Run(fmt.Sprintf("walk/files=%d", n), func(b *testing.B) {
			for b.Loop() {
				for _, v := range st.Volumes {
					if _, err := walkLayer(context.Background(), s.LayerPath(v.Upper)); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}
