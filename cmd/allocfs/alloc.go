package main

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/api"
)

var allocCommands = []command{
	{"create", "create an allocation", runAllocCreate},
	{"list", "list allocations", runAllocList},
	{"status", "show an allocation's layout, layers and usage", runAllocStatus},
	{"stop", "make an allocation terminal: kept and browsable until GC", runAllocStop},
	{"destroy", "destroy an allocation and the layers only it uses", runAllocDestroy},
	{"fs", "list, describe, print or follow an allocation's files, as 'nomad alloc fs'", runAllocFS},
	{"logs", "print or follow a task's logs across rotation, as 'nomad alloc logs'", runAllocLogs},
}

func runAlloc(e *env, args []string) error {
	return dispatch("allocfs alloc", allocCommands, e, args)
}

// checkAllocID refuses IDs the server refuses too, before dialing it. It
// is an error rather than a usage error: the command line was well formed.
func checkAllocID(id string) error {
	if err := allocdir.ValidID(id); err != nil {
		return fmt.Errorf("invalid allocation ID: %w", err)
	}
	return nil
}

func runAllocCreate(e *env, args []string) error {
	const cmd = "allocfs alloc create"
	fset := newFlagSet(e, cmd, "ID --task NAME [--task NAME...] [flags]", `
Create an allocation: its directory appears at <mount>/ID with alloc/ and one
directory per task. Every layer starts empty, unless --previous names the
allocation this one replaces and --sticky or --migrate asks for its data:
then alloc/data and the local/ of each task both have are handed over without
copying a byte, by adoption (the previous allocation keeps its logs and a
read-only MIGRATED-TO note) or, with --migrate-mode snapshot, by sealing the
previous data read-only under a fresh layer (it keeps a frozen view). The
previous allocation must be stopped first.`)
	socket := socketFlag(e, fset)
	var (
		taskNames []string
		users     []string
		secretsMB int
	)
	fset.StringArrayVar(&taskNames, "task", nil, "a task `NAME`; repeat for several tasks (at least one)")
	fset.StringArrayVar(&users, "user", nil, "`TASK=USER` owns the task's secrets/ and private/ (mode 0700); repeatable")
	fset.IntVar(&secretsMB, "secrets-mb", 0, "size cap of each task's secrets/ in `MiB` (0: 1 MiB)")
	previous := fset.String("previous", "", "the `ID` of the allocation this one replaces")
	sticky := fset.Bool("sticky", false, "take over the previous allocation's data on this node")
	migrateData := fset.Bool("migrate", false, "take over the previous allocation's data (implies --sticky)")
	mode := fset.String("migrate-mode", "adopt", "how data is handed over on this node: `adopt` or snapshot")
	from := fset.String("from", "", "base `URL` of the node holding --previous (http://host:port); needs --migrate")
	tokenFile := fset.String("token-file", "", "`file` holding the migration token the --from node expects")
	asJSON := fset.Bool("json", false, "print the new allocation's record as JSON")
	diskMB := fset.Int64("disk-mb", 0, "disk limit in `MiB` of what the allocation's volumes hold (alloc/data, logs, tmp, every task's local/ and tmp/), as Nomad's ephemeral_disk.size; 0: the node's default. A node that cannot enforce it refuses")
	diskInodes := fset.Int64("disk-inodes", 0, "limit on the `number` of files and directories the allocation's volumes hold; only where the filesystem counts them (btrfs does not: the node refuses it there)")
	if err := parseNomadFlags(fset, args, 1, 1); err != nil {
		return err
	}
	if *diskMB < 0 {
		return usageErrorf(cmd, "--disk-mb must not be negative, got %d", *diskMB)
	}
	if *diskInodes < 0 {
		return usageErrorf(cmd, "--disk-inodes must not be negative, got %d", *diskInodes)
	}
	if len(taskNames) == 0 {
		return usageErrorf(cmd, "at least one --task is required")
	}
	if secretsMB < 0 {
		return usageErrorf(cmd, "--secrets-mb must not be negative, got %d", secretsMB)
	}
	policy := ""
	switch {
	case *migrateData:
		policy = "migrate"
	case *sticky:
		policy = "sticky"
	}
	if policy != "" && *previous == "" {
		return usageErrorf(cmd, "--sticky and --migrate need --previous")
	}
	if *mode != "adopt" && *mode != "snapshot" {
		return usageErrorf(cmd, "--migrate-mode is adopt or snapshot, not %q", *mode)
	}
	if *previous != "" {
		if err := checkAllocID(*previous); err != nil {
			return err
		}
	}
	var token string
	if *from != "" {
		if policy != "migrate" {
			return usageErrorf(cmd, "--from needs --migrate")
		}
		if *tokenFile != "" {
			b, err := os.ReadFile(*tokenFile)
			if err != nil {
				return fmt.Errorf("failed to read the migration token: %w", err)
			}
			token = strings.TrimSpace(string(b))
		}
	}
	id := fset.Arg(0)
	if err := checkAllocID(id); err != nil {
		return err
	}

	tasks := make([]api.Task, 0, len(taskNames))
	index := make(map[string]int, len(taskNames))
	for _, name := range taskNames {
		if err := allocdir.ValidTaskName(name); err != nil {
			return fmt.Errorf("invalid task name: %w", err)
		}
		if _, dup := index[name]; dup {
			return usageErrorf(cmd, "task %q is given twice", name)
		}
		index[name] = len(tasks)
		tasks = append(tasks, api.Task{Name: name, SecretsMB: secretsMB})
	}
	for _, u := range users {
		task, user, ok := strings.Cut(u, "=")
		if !ok || task == "" || user == "" {
			return usageErrorf(cmd, "--user wants TASK=USER, got %q", u)
		}
		i, known := index[task]
		if !known {
			return usageErrorf(cmd, "--user %q names a task not given with --task", u)
		}
		tasks[i].User = user
	}

	ctx, c, done := dial(*socket)
	defer done()
	req := api.CreateAllocRequest{ID: id, Tasks: tasks, Previous: *previous, Migrate: policy, Mode: *mode, From: *from, Token: token, DiskMB: *diskMB, DiskInodes: *diskInodes}
	var st *api.Alloc
	var err error
	if *from != "" {
		st, err = c.CreateWithProgress(ctx, req, newProgressPrinter(e.stderr, isTerminal(e.stderr), *previous))
	} else {
		st, err = c.Create(ctx, req)
	}
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(e.stdout, st)
	}
	fmt.Fprintf(e.stdout, "created allocation %s (tasks: %s)\n", st.ID, strings.Join(st.TaskNames(), ", "))
	switch {
	case st.Previous != "" && *from != "":
		fmt.Fprintf(e.stdout, "fetched the data of %s from %s\n", st.Previous, *from)
	case st.Previous != "":
		fmt.Fprintf(e.stdout, "took over the data of %s (%s)\n", st.Previous, *mode)
	}
	return nil
}

func runAllocStop(e *env, args []string) error {
	fset := newFlagSet(e, "allocfs alloc stop", "ID [flags]", `
Stop an allocation: it becomes terminal. Its directory stays in the mount,
browsable, its logs readable, until garbage collection (allocfs gc).`)
	socket := socketFlag(e, fset)
	asJSON := fset.Bool("json", false, "print the allocation's record as JSON")
	if err := parseNomadFlags(fset, args, 1, 1); err != nil {
		return err
	}
	ctx, c, done := dial(*socket)
	defer done()
	id, err := resolveID(ctx, c, fset.Arg(0))
	if err != nil {
		return err
	}
	st, err := c.StopAlloc(ctx, id)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(e.stdout, st)
	}
	fmt.Fprintf(e.stdout, "stopped allocation %s\n", id)
	return nil
}

func runGC(e *env, args []string) error {
	fset := newFlagSet(e, "allocfs gc", "[ID] [flags]", `
Collect terminal allocations: with an ID, that one (it must be stopped);
without, every stopped allocation, oldest first. Layers that another
allocation still stacks on survive.`)
	socket := socketFlag(e, fset)
	asJSON := fset.Bool("json", false, "print what was collected as JSON")
	if err := parseNomadFlags(fset, args, 0, 1); err != nil {
		return err
	}
	ctx, c, done := dial(*socket)
	defer done()
	// A full ID only, as for destroy.
	id := fset.Arg(0)
	if id != "" {
		if err := checkAllocID(id); err != nil {
			return err
		}
	}
	collected, err := c.GC(ctx, id)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(e.stdout, api.GCResponse{Collected: collected})
	}
	if len(collected) == 0 {
		fmt.Fprintln(e.stdout, "nothing to collect: no terminal allocations")
		return nil
	}
	for _, id := range collected {
		fmt.Fprintf(e.stdout, "collected allocation %s\n", id)
	}
	return nil
}

func runAllocList(e *env, args []string) error {
	fset := newFlagSet(e, "allocfs alloc list", "[flags]", "List the allocations the daemon holds, sorted by ID.")
	socket := socketFlag(e, fset)
	asJSON := fset.Bool("json", false, "print the records as JSON")
	if err := parseNomadFlags(fset, args, 0, 0); err != nil {
		return err
	}
	ctx, c, done := dial(*socket)
	defer done()
	list, err := c.ListAllocs(ctx)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(e.stdout, list)
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATUS\tTASKS\tCREATED")
	for _, st := range list {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", st.ID, st.Status, strings.Join(st.TaskNames(), ","), st.Created.Local().Format(time.RFC3339))
	}
	return tw.Flush()
}

func runAllocStatus(e *env, args []string) error {
	fset := newFlagSet(e, "allocfs alloc status", "ID [flags]", `
Show an allocation: where it is mounted, its layout, the layer behind each
volume and what that layer holds on the backing store.`)
	socket := socketFlag(e, fset)
	asJSON := fset.Bool("json", false, "print the daemon's answer as JSON")
	if err := parseNomadFlags(fset, args, 1, 1); err != nil {
		return err
	}
	ctx, c, done := dial(*socket)
	defer done()
	id, err := resolveID(ctx, c, fset.Arg(0))
	if err != nil {
		return err
	}
	if *asJSON {
		raw, err := c.AllocStatusJSON(ctx, id)
		if err != nil {
			return err
		}
		_, err = e.stdout.Write(raw)
		return err
	}
	st, err := c.AllocStatus(ctx, id)
	if err != nil {
		return err
	}
	return printAllocStatus(e, st)
}

// printAllocStatus prints an allocation's status for people.
func printAllocStatus(e *env, st *api.AllocStatus) error {
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "ID\t%s\n", st.ID)
	fmt.Fprintf(tw, "Status\t%s\n", st.Status)
	fmt.Fprintf(tw, "Created\t%s\n", st.Created.Local().Format(time.RFC3339))
	fmt.Fprintf(tw, "Mount\t%s\n", st.Mount)
	fmt.Fprintf(tw, "Passthrough\t%t\n", st.Passthrough)
	fmt.Fprintf(tw, "Tasks\t%s\n", strings.Join(st.TaskNames(), ", "))
	if d := st.Disk; d != nil {
		fmt.Fprintf(tw, "Disk\t%s used of %s (%s)\n", formatBytes(d.UsedBytes), formatBytes(d.LimitBytes), d.Mechanism)
		if d.LimitInodes > 0 {
			fmt.Fprintf(tw, "Disk inodes\t%d used of %d\n", d.UsedInodes, d.LimitInodes)
		}
	}
	if st.Origin == api.OriginMount {
		fmt.Fprintf(tw, "Made by\tNomad's client, through the mount (it removes the allocation itself)\n")
	}
	if st.Previous != "" {
		fmt.Fprintf(tw, "Previous\t%s\n", st.Previous)
	}
	if st.MigratedTo != "" {
		fmt.Fprintf(tw, "Migrated to\t%s\n", st.MigratedTo)
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	fmt.Fprintln(e.stdout, "\nLayout:")
	tw = tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  PATH\tBACKED BY\tFILES\tSIZE")
	for _, key := range layoutKeys(st) {
		p := filepath.Join(st.Mount, key)
		if u, ok := st.Layers[key]; ok {
			backing := "layer " + u.Upper
			if len(u.Lowers) > 0 {
				backing += " over " + strings.Join(u.Lowers, ", ")
			}
			fmt.Fprintf(tw, "  %s\t%s\t%d\t%s\n", p, backing, u.Files, formatBytes(u.Bytes))
			continue
		}
		if note := memoryNote(st, key); note != "" {
			fmt.Fprintf(tw, "  %s\t%s\t-\t-\n", p, note)
		}
	}
	return tw.Flush()
}

// layoutKeys lists the directories of an allocation that may hold
// content, in layout order: alloc/ first, then each task in the order it
// was given, the task directory before its children. Volumes the client
// does not know of (added by a newer daemon) follow.
func layoutKeys(st *api.AllocStatus) []string {
	var keys []string
	for _, d := range allocdir.SharedAllocDirs {
		keys = append(keys, path.Join(allocdir.SharedAllocName, d))
	}
	for _, t := range st.Tasks {
		keys = append(keys, t.Name)
		for _, d := range []string{allocdir.TaskLocal, allocdir.TmpDirName, allocdir.TaskSecrets, allocdir.TaskPrivate} {
			keys = append(keys, path.Join(t.Name, d))
		}
	}
	seen := make(map[string]bool, len(keys))
	for _, k := range keys {
		seen[k] = true
	}
	var extra []string
	for k := range st.Layers {
		if !seen[k] {
			extra = append(extra, k)
		}
	}
	sort.Strings(extra)
	return append(keys, extra...)
}

// memoryNote describes a directory that has no layer: secrets/ and
// private/ live in memory only. It returns "" for any other key.
func memoryNote(st *api.AllocStatus, key string) string {
	task, dir := path.Split(key)
	task = strings.TrimSuffix(task, "/")
	switch dir {
	case allocdir.TaskSecrets:
		for _, t := range st.Tasks {
			if t.Name == task {
				return "memory, capped at " + formatBytes(allocdir.Task{SecretsMB: t.SecretsMB}.SecretsBytes())
			}
		}
	case allocdir.TaskPrivate:
		return "memory, capped at " + formatBytes(allocdir.Task{}.PrivateBytes())
	}
	return ""
}

func runAllocDestroy(e *env, args []string) error {
	fset := newFlagSet(e, "allocfs alloc destroy", "ID [flags]", `
Destroy an allocation: its directory leaves the mount and the layers no other
allocation uses are removed from the data dir. Secrets are dropped.`)
	socket := socketFlag(e, fset)
	if err := parseNomadFlags(fset, args, 1, 1); err != nil {
		return err
	}
	// A full ID only: IDs need not be UUIDs, and a retried destroy of a1
	// must not find a12.
	id := fset.Arg(0)
	if err := checkAllocID(id); err != nil {
		return err
	}
	ctx, c, done := dial(*socket)
	defer done()
	if err := c.DestroyAlloc(ctx, id); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "destroyed allocation %s\n", id)
	return nil
}

func runStatus(e *env, args []string) error {
	fset := newFlagSet(e, "allocfs status", "[flags]", "Show the node as the daemon sees it.")
	socket := socketFlag(e, fset)
	asJSON := fset.Bool("json", false, "print the daemon's answer as JSON")
	if err := parseNomadFlags(fset, args, 0, 0); err != nil {
		return err
	}
	ctx, c, done := dial(*socket)
	defer done()
	st, err := c.NodeStatus(ctx)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(e.stdout, st)
	}
	b := st.Backing
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "Data dir\t%s\n", st.DataDir)
	fmt.Fprintf(tw, "Mount\t%s\n", st.Mount)
	fmt.Fprintf(tw, "Passthrough\t%t\n", st.Passthrough)
	fmt.Fprintf(tw, "Allocations\t%d\n", st.Allocs)
	fmt.Fprintf(tw, "Backing space\t%s available of %s (%s free)\n",
		formatBytes(int64(b.BytesAvailable)), formatBytes(int64(b.BytesTotal)), formatBytes(int64(b.BytesFree)))
	fmt.Fprintf(tw, "Backing inodes\t%d free of %d\n", b.FilesFree, b.FilesTotal)
	switch q := st.Quota; {
	case q.Enforced && q.DefaultMB > 0:
		fmt.Fprintf(tw, "Disk limits\tenforced (%s on %s), %d MiB by default\n", q.Mechanism, q.Filesystem, q.DefaultMB)
	case q.Enforced:
		fmt.Fprintf(tw, "Disk limits\tenforced (%s on %s), none by default\n", q.Mechanism, q.Filesystem)
	default:
		fmt.Fprintf(tw, "Disk limits\tnot enforced: %s\n", q.Why)
	}
	return tw.Flush()
}

// formatBytes prints n in binary units: 512 B, 1.5 KiB, 3.0 GiB.
func formatBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 5; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
