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
)

var fsCommands = []command{
	{"ls", "list a directory of an allocation", runFSList},
	{"stat", "describe a file of an allocation", runFSStat},
	{"cat", "print a file of an allocation", runFSCat},
}

func runFS(e *env, args []string) error {
	return dispatch("allocfs fs", fsCommands, e, args)
}

// nomadFlags rewrites Nomad's single-dash long flags (-stderr, -json) as
// pflag's double-dash ones, so that both spellings work. Single letters
// (-f, -n 5) are pflag shorthands already; everything after "--" is left
// alone.
func nomadFlags(args []string, long ...string) []string {
	out := make([]string, 0, len(args))
	for i, a := range args {
		if a == "--" {
			return append(out, args[i:]...)
		}
		name, _, _ := strings.Cut(strings.TrimPrefix(a, "-"), "=")
		if strings.HasPrefix(a, "-") && !strings.HasPrefix(a, "--") {
			for _, l := range long {
				if name == l {
					a = "-" + a
					break
				}
			}
		}
		out = append(out, a)
	}
	return out
}

// fsTarget checks the ID and PATH arguments of an fs command.
func fsTarget(args []string) (id, p string, err error) {
	id, p = args[0], "/"
	if len(args) > 1 {
		p = args[1]
	}
	return id, p, checkAllocID(id)
}

func runFSList(e *env, args []string) error {
	fset := newFlagSet(e, "allocfs fs ls", "ID [PATH] [flags]", `
List the directory PATH (default /) of allocation ID, as 'nomad alloc fs'
does. Content is read from the store, never through the mount; listing
secrets/ and private/ is allowed, reading them is not.`)
	socket := socketFlag(e, fset)
	asJSON := fset.Bool("json", false, "print the entries as JSON (Nomad's AllocFileInfo)")
	human := fset.BoolP("human", "H", false, "print sizes in human units")
	if err := parseFlags(fset, nomadFlags(args, "json"), 1, 2); err != nil {
		return err
	}
	id, p, err := fsTarget(fset.Args())
	if err != nil {
		return err
	}
	ctx, c, done := dial(*socket)
	defer done()
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
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", f.FileMode, sizeString(f.Size, *human), f.ModTime.Local().Format(time.RFC3339), name)
	}
	return tw.Flush()
}

func runFSStat(e *env, args []string) error {
	fset := newFlagSet(e, "allocfs fs stat", "ID PATH [flags]", `
Describe the file PATH of allocation ID: mode, size, modification time and
content type, as 'nomad alloc fs -stat' does.`)
	socket := socketFlag(e, fset)
	asJSON := fset.Bool("json", false, "print Nomad's AllocFileInfo as JSON")
	human := fset.BoolP("human", "H", false, "print the size in human units")
	if err := parseFlags(fset, nomadFlags(args, "json"), 2, 2); err != nil {
		return err
	}
	id, p, err := fsTarget(fset.Args())
	if err != nil {
		return err
	}
	ctx, c, done := dial(*socket)
	defer done()
	f, err := c.Stat(ctx, id, p)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(e.stdout, f)
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "Mode\tSize\tModified Time\tContent Type\tName")
	fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", f.FileMode, sizeString(f.Size, *human), f.ModTime.Local().Format(time.RFC3339), f.ContentType, f.Name)
	return tw.Flush()
}

func runFSCat(e *env, args []string) error {
	fset := newFlagSet(e, "allocfs fs cat", "ID PATH [flags]", `
Print the file PATH of allocation ID. Files under a task's secrets/ or
private/, or reached through a link into them or out of the allocation,
are refused.`)
	socket := socketFlag(e, fset)
	if err := parseFlags(fset, args, 2, 2); err != nil {
		return err
	}
	id, p, err := fsTarget(fset.Args())
	if err != nil {
		return err
	}
	ctx, c, done := dial(*socket)
	defer done()
	body, err := c.Cat(ctx, id, p)
	if err != nil {
		return err
	}
	defer body.Close()
	if _, err := io.Copy(e.stdout, body); err != nil {
		return fmt.Errorf("reading %s of %s broke off: %w", p, id, err)
	}
	return nil
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "    ")
	return enc.Encode(v)
}

func sizeString(n int64, human bool) string {
	if human {
		return formatBytes(n)
	}
	return fmt.Sprint(n)
}

// bytesPerLine is the guess at line length that turns -n LINES into how
// far back from the end to start; what arrives is then cut to LINES.
const bytesPerLine = 1024

// caughtUp is how long a tailing stream must stay quiet before what it
// sent counts as the backlog: longer than the server's 200 ms batching.
const caughtUp = 400 * time.Millisecond

func runLogs(e *env, args []string) error {
	fset := newFlagSet(e, "allocfs logs", "ID TASK [flags]", `
Print the stdout (or, with -stderr, the stderr) of task TASK of allocation
ID, across its rotated log files, as 'nomad alloc logs' does. With -f the
command follows the logs as they are written, across rotation, until
interrupted. With -tail it starts -n lines (default 10) or -c bytes from
the end. With --previous it reads the logs of the allocation ID replaced,
which stay until that one is collected.`)
	socket := socketFlag(e, fset)
	follow := fset.BoolP("follow", "f", false, "follow the logs as they are written")
	stderr := fset.Bool("stderr", false, "print stderr instead of stdout")
	tail := fset.Bool("tail", false, "start from the end: -n lines or -c bytes before it")
	lines := fset.IntP("lines", "n", 10, "with -tail, how many `lines` to print")
	byteCount := fset.Int64P("bytes", "c", 0, "with -tail, how many `bytes` before the end to start")
	previous := fset.Bool("previous", false, "read the logs of the allocation ID replaced")
	if err := parseFlags(fset, nomadFlags(args, "stderr", "tail", "previous"), 2, 2); err != nil {
		return err
	}
	id, task := fset.Arg(0), fset.Arg(1)
	if err := checkAllocID(id); err != nil {
		return err
	}
	if err := allocdir.ValidTaskName(task); err != nil {
		return fmt.Errorf("invalid task name: %w", err)
	}
	if *lines < 0 || *byteCount < 0 {
		return usageErrorf("allocfs logs", "-n and -c must not be negative")
	}
	if fset.Changed("lines") && fset.Changed("bytes") {
		return usageErrorf("allocfs logs", "-n and -c cannot be used together")
	}
	ctx, c, done := dial(*socket)
	defer done()
	if *previous {
		st, err := c.AllocStatus(ctx, id)
		if err != nil {
			return err
		}
		if st.Previous == "" {
			return fmt.Errorf("allocation %s did not replace another allocation", id)
		}
		id = st.Previous
	}
	q := api.LogsQuery{Task: task, Type: "stdout", Follow: *follow}
	if *stderr {
		q.Type = "stderr"
	}
	keep := -1
	if *tail {
		q.Origin = "end"
		switch {
		case *byteCount > 0:
			q.Offset = *byteCount
		default:
			q.Offset = int64(*lines) * bytesPerLine
			keep = *lines
		}
	}
	frames, err := c.Logs(ctx, id, q)
	if err != nil && ctx.Err() != nil {
		// Interrupted before the first byte: that is how -f ends.
		return nil
	}
	if err != nil {
		if *previous && collected(err) {
			return fmt.Errorf("the logs of %s, the allocation replaced, are gone: it was collected (%w)", id, err)
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
// backlog (what arrives before the stream first goes quiet, or all of it
// when the stream ends) is cut to its last keep lines.
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
		var tick <-chan time.Time
		if holding {
			tick = quiet.C
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
