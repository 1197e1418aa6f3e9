// Command tmpfscost measures what one detached tmpfs (internal/tmpfs)
// costs: it makes -n instances of -size bytes, writes -write bytes into a
// file of each, and prints the time per instance and what the kernel's
// memory counters (/proc/meminfo: Shmem, Slab, SUnreclaim, MemAvailable)
// moved by, per instance; then it closes them all and prints the counters
// again. Run as root. See ../README.md.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"log"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/allocfs/allocfs/internal/tmpfs"
)

func meminfo() map[string]int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		log.Fatal(err)
	}
	defer f.Close()
	out := map[string]int64{}
	s := bufio.NewScanner(f)
	for s.Scan() {
		name, rest, ok := strings.Cut(s.Text(), ":")
		if !ok {
			continue
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			continue
		}
		v, _ := strconv.ParseInt(fields[0], 10, 64)
		out[name] = v
	}
	return out
}

func main() {
	n := flag.Int("n", 1000, "instances")
	size := flag.Int64("size", 1<<20, "byte cap of each")
	write := flag.Int("write", 4096, "bytes written into a file of each")
	flag.Parse()
	keys := []string{"Shmem", "Slab", "SUnreclaim", "MemAvailable"}
	before := meminfo()
	start := time.Now()
	var all []*tmpfs.FS
	data := make([]byte, *write)
	for range *n {
		f, err := tmpfs.New(tmpfs.Options{Bytes: *size, Inodes: 1024, Mode: 0o700})
		if err != nil {
			log.Fatal(err)
		}
		if err := os.WriteFile(f.Path()+"/token", data, 0o600); err != nil {
			log.Fatal(err)
		}
		all = append(all, f)
	}
	took := time.Since(start)
	during := meminfo()
	fmt.Printf("%d instances of %d bytes, %d bytes written in each: %v per instance (noswap %v)\n", *n, *size, *write, took/time.Duration(*n), all[0].NoSwap())
	for _, k := range keys {
		fmt.Printf("  %-12s %+8.1f KiB per instance\n", k, float64(during[k]-before[k])/float64(*n))
	}
	start = time.Now()
	for _, f := range all {
		f.Close()
	}
	closed := time.Since(start)
	time.Sleep(2 * time.Second) // the superblocks go asynchronously
	after := meminfo()
	fmt.Printf("closed in %v; left 2 s later:\n", closed)
	for _, k := range keys {
		fmt.Printf("  %-12s %+8.1f KiB per instance\n", k, float64(after[k]-before[k])/float64(*n))
	}
}
