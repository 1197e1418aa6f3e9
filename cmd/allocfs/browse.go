package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/api"
	"github.com/allocfs/allocfs/api/fsapi"
	"github.com/spf13/pflag"
)

func runAllocFS(e *env, args []string) error {
	const cmd = "allocfs alloc fs"
	fset := newFlagSet(e, cmd, "[flags] ALLOC [PATH]", `
Browse the files of allocation ALLOC (an ID or a unique prefix of one), as
'nomad alloc fs' does: a directory PATH (default /) is listed, a file is
printed. With -stat, PATH is described instead. With -f a file is
followed as it grows until interrupted; with -tail printing starts -n
lines (default 10) or -c bytes before the end. Sizes are in binary units
unless -H asks for plain bytes.

Files are read from the store, never through the mount. Listing secrets/
and private/ is allowed, reading them is not. With -address the command
reaches another node's API, behind its token.`)
	client := clientFlags(e, fset)
	stat := fset.Bool("stat", false, "describe PATH instead of listing or printing it")
	follow := fset.BoolP("follow", "f", false, "follow the file as it grows")
	tail := fset.Bool("tail", false, "start printing the file -n lines or -c bytes before its end")
	lines := fset.IntP("lines", "n", 10, "with -tail, how many `lines` to print")
	byteCount := fset.Int64P("bytes", "c", 0, "with -tail, how many `bytes` before the end to start")
	machine := fset.BoolP("machine", "H", false, "machine-friendly output: sizes in bytes")
	asJSON := fset.Bool("json", false, "print listings and -stat as JSON (Nomad's AllocFileInfo)")
	if err := parseNomadFlags(fset, args, 1, 2); err != nil {
		return err
	}
	if err := checkTailFlags(cmd, fset, *lines, *byteCount); err != nil {
		return err
	}
	if err := checkAllocID(fset.Arg(0)); err != nil {
		return err
	}
	p := "/"
	if fset.NArg() > 1 {
		p = fset.Arg(1)
	}
	ctx, c, done, err := client.dial()
	if err != nil {
		return err
	}
	defer done()
	alloc, err := resolveAlloc(ctx, c, fset.Arg(0))
	if err != nil {
		return err
	}
	id := alloc.ID
	f, err := c.Stat(ctx, id, p)
	if err != nil {
		return err
	}
	switch {
	case *stat:
		if *asJSON {
			return printJSON(e.stdout, f)
		}
		tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "Mode\tSize\tModified Time\tContent Type\tName")
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", f.FileMode, sizeString(f.Size, *machine), f.ModTime.Local().Format(time.RFC3339), f.ContentType, f.Name)
		return tw.Flush()
	case f.IsDir:
		if *follow || *tail {
			return fmt.Errorf("%s of allocation %q is a directory: -f and -tail follow files", p, id)
		}
		files, err := c.List(ctx, id, p)
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(e.stdout, files)
		}
		tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "Mode\tSize\tModified Time\tName")
		for _, f := range files {
			name := f.Name
			if f.IsDir {
				name += "/"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", f.FileMode, sizeString(f.Size, *machine), f.ModTime.Local().Format(time.RFC3339), name)
		}
		return tw.Flush()
	case !*follow && !*tail:
		body, err := c.Cat(ctx, id, p)
		if err != nil {
			return err
		}
		defer body.Close()
		if _, err := io.Copy(e.stdout, body); err != nil {
			return fmt.Errorf("reading %s of allocation %q broke off: %w", p, id, err)
		}
		return nil
	}
	q := api.StreamQuery{Path: p, Follow: *follow}
	keep := tailFrom(&q.Origin, &q.Offset, *tail, *lines, *byteCount)
	frames, err := c.Stream(ctx, id, q)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	defer frames.Close()
	return copyLogs(ctx, e.stdout, frames, keep)
}

// checkTailFlags refuses -n and -c together or negative.
func checkTailFlags(cmd string, fset *pflag.FlagSet, lines int, byteCount int64) error {
	if lines < 0 || byteCount < 0 {
		return usageErrorf(cmd, "-n and -c must not be negative")
	}
	if fset.Changed("lines") && fset.Changed("bytes") {
		return usageErrorf(cmd, "-n and -c cannot be used together")
	}
	return nil
}

// tailFrom sets where a stream starts for -tail, -n and -c, and returns
// how many lines of the backlog to keep (-1: all).
func tailFrom(origin *string, offset *int64, tail bool, lines int, byteCount int64) int {
	if !tail {
		return -1
	}
	*origin = "end"
	if byteCount > 0 {
		*offset = byteCount
		return -1
	}
	*offset = int64(lines) * bytesPerLine
	return lines
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "    ")
	return enc.Encode(v)
}

// sizeString is n in binary units, or in bytes for machines.
func sizeString(n int64, machine bool) string {
	if machine {
		return fmt.Sprint(n)
	}
	return formatBytes(n)
}

// bytesPerLine is the guess at line length that turns -n LINES into how
// far back from the end to start; what arrives is then cut to LINES.
const bytesPerLine = 1024

// caughtUp is how long a tailing stream must stay quiet before what it
// sent counts as the backlog: longer than the server's 200 ms batching.
const caughtUp = 400 * time.Millisecond

// maxHold bounds how long the backlog is held from its first data: a
// task that writes more often than caughtUp never lets the stream go
// quiet, and -f -tail must still print.
const maxHold = time.Second

func runAllocLogs(e *env, args []string) error {
	const cmd = "allocfs alloc logs"
	fset := newFlagSet(e, cmd, "[flags] ALLOC [TASK]", `
Print the stdout (or, with -stderr, the stderr) of task TASK of allocation
ALLOC (an ID or a unique prefix of one), across its rotated log files, as
'nomad alloc logs' does; TASK may be left out when the allocation has one.
With -f the command follows the logs as they are written, across
rotation, until interrupted. With -tail it starts -n lines (default 10)
or -c bytes from the end. With -previous it reads the logs of the
allocation ALLOC replaced, which stay until that one is collected. With
-address it reaches another node's API, behind its token.`)
	client := clientFlags(e, fset)
	follow := fset.BoolP("follow", "f", false, "follow the logs as they are written")
	stderr := fset.Bool("stderr", false, "print stderr instead of stdout")
	fset.Bool("stdout", true, "print stdout (the default)")
	tail := fset.Bool("tail", false, "start from the end: -n lines or -c bytes before it")
	lines := fset.IntP("lines", "n", 10, "with -tail, how many `lines` to print")
	byteCount := fset.Int64P("bytes", "c", 0, "with -tail, how many `bytes` before the end to start")
	previous := fset.Bool("previous", false, "read the logs of the allocation ALLOC replaced")
	verbose := fset.Bool("verbose", false, "say on stderr which allocation and task are read")
	if err := parseNomadFlags(fset, args, 1, 2); err != nil {
		return err
	}
	if err := checkTailFlags(cmd, fset, *lines, *byteCount); err != nil {
		return err
	}
	if err := checkAllocID(fset.Arg(0)); err != nil {
		return err
	}
	if task := fset.Arg(1); task != "" {
		if err := allocdir.ValidTaskName(task); err != nil {
			return fmt.Errorf("invalid task name: %w", err)
		}
	}
	ctx, c, done, err := client.dial()
	if err != nil {
		return err
	}
	defer done()
	alloc, err := resolveAlloc(ctx, c, fset.Arg(0))
	if err != nil {
		return err
	}
	id := alloc.ID
	if *previous {
		if client.remote.Address != "" {
			return errors.New("-previous needs the control socket: a node's TCP API does not say which allocation another replaced")
		}
		st, err := c.AllocStatus(ctx, id)
		if err != nil {
			return err
		}
		if st.Previous == "" {
			return fmt.Errorf("allocation %q did not replace another allocation", id)
		}
		// Its tasks are the ones to choose from: they may differ.
		if alloc, err = resolveAlloc(ctx, c, st.Previous); err != nil {
			if collected(err) || errors.Is(err, allocdir.ErrUnknownAlloc) {
				return fmt.Errorf("the logs of %q, the allocation replaced, are gone: it was collected", st.Previous)
			}
			return err
		}
		id = alloc.ID
	}
	task, err := resolveTask(alloc, fset.Arg(1))
	if err != nil {
		return err
	}
	q := api.LogsQuery{Task: task, Type: "stdout", Follow: *follow}
	if *stderr {
		q.Type = "stderr"
	}
	if *verbose {
		fmt.Fprintf(e.stderr, "allocation %s, task %s, %s\n", id, task, q.Type)
	}
	keep := tailFrom(&q.Origin, &q.Offset, *tail, *lines, *byteCount)
	frames, err := c.Logs(ctx, id, q)
	if err != nil && ctx.Err() != nil {
		// Interrupted before the first byte: that is how -f ends.
		return nil
	}
	if err != nil {
		if *previous && collected(err) {
			return fmt.Errorf("the logs of %q, the allocation replaced, are gone: it was collected (%w)", id, err)
		}
		return err
	}
	defer frames.Close()
	return copyLogs(ctx, e.stdout, frames, keep)
}

// collected reports whether err says the allocation is unknown to the
// daemon, as opposed to another 404 (no log file of that type). Nomad's
// client API tells them apart by message only.
func collected(err error) bool {
	var apiErr *api.Error
	if !errors.As(err, &apiErr) || !errors.Is(err, allocdir.ErrUnknownAlloc) {
		return false
	}
	return strings.HasPrefix(apiErr.Message, "Unknown allocation") ||
		strings.HasPrefix(apiErr.Message, "state for allocation")
}

// copyLogs writes the data of a log stream to w. With keep >= 0 the
// backlog (what arrives before the stream first goes quiet or in the
// first maxHold of data, or all of it when the stream ends) is cut to its
// last keep lines.
func copyLogs(ctx context.Context, w io.Writer, frames *api.FrameReader, keep int) error {
	type result struct {
		f   *fsapi.Frame
		err error
	}
	next := make(chan result)
	go func() {
		for {
			f, err := frames.Next()
			select {
			case next <- result{f, err}:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	out := bufio.NewWriter(w)
	defer out.Flush()
	var backlog []byte
	holding := keep >= 0
	// The quiet timer runs from the first data on: a backlog is over when
	// data stops coming, not when it is slow to start.
	quiet := time.NewTimer(caughtUp)
	quiet.Stop()
	defer quiet.Stop()
	held := time.NewTimer(maxHold)
	held.Stop()
	defer held.Stop()
	release := func() error {
		holding = false
		_, err := out.Write(lastLines(backlog, keep))
		backlog = nil
		if err == nil {
			err = out.Flush()
		}
		return err
	}
	for {
		var tick, hold <-chan time.Time
		if holding {
			tick, hold = quiet.C, held.C
		}
		select {
		case <-ctx.Done():
			if holding {
				return release()
			}
			return nil
		case <-tick:
			if err := release(); err != nil {
				return err
			}
		case <-hold:
			if err := release(); err != nil {
				return err
			}
		case r := <-next:
			if errors.Is(r.err, io.EOF) {
				if holding {
					return release()
				}
				return nil
			}
			if r.err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return r.err
			}
			if len(r.f.Data) == 0 {
				continue
			}
			if holding {
				if backlog == nil {
					held.Reset(maxHold)
				}
				backlog = append(backlog, r.f.Data...)
				quiet.Reset(caughtUp)
				continue
			}
			if _, err := out.Write(r.f.Data); err != nil {
				return err
			}
			if err := out.Flush(); err != nil {
				return err
			}
		}
	}
}

// lastLines returns the last n lines of b (a final line without its
// newline counts).
func lastLines(b []byte, n int) []byte {
	if n == 0 {
		return nil
	}
	end := len(b)
	if end > 0 && b[end-1] == '\n' {
		end--
	}
	for i := 0; i < n; i++ {
		j := bytes.LastIndexByte(b[:end], '\n')
		if j < 0 {
			return b
		}
		if i == n-1 {
			return b[j+1:]
		}
		end = j
	}
	return b
}
