package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/api"
	"github.com/spf13/pflag"
)

// Environment variables of the client flags, after Nomad's NOMAD_ADDR,
// NOMAD_TOKEN, NOMAD_CACERT, NOMAD_CLIENT_CERT and NOMAD_CLIENT_KEY.
const (
	addrEnv       = "ALLOCFS_ADDR"
	tokenEnv      = "ALLOCFS_TOKEN"
	caCertEnv     = "ALLOCFS_CACERT"
	clientCertEnv = "ALLOCFS_CLIENT_CERT"
	clientKeyEnv  = "ALLOCFS_CLIENT_KEY"
)

// socketFlag adds --socket to a command that needs the control socket.
// Its default comes from $ALLOCFS_SOCKET, else api.DefaultSocket.
func socketFlag(e *env, fset *pflag.FlagSet) *string {
	def := e.getenv(api.SocketEnv)
	if def == "" {
		def = api.DefaultSocket
	}
	return fset.String("socket", def, "`path` of the control socket of `allocfs serve` (env "+api.SocketEnv+")")
}

// clientOptions says which daemon a command talks to: the local socket,
// or with -address a node's TCP listener, where only the client API
// answers (files, logs, the allocation list).
type clientOptions struct {
	socket *string
	remote api.Remote
}

// clientFlags adds the flags of a command that may reach another node:
// --socket, and Nomad's -address, -token, -ca-cert, -client-cert and
// -client-key, each defaulting to its environment variable.
func clientFlags(e *env, fset *pflag.FlagSet) *clientOptions {
	o := &clientOptions{socket: socketFlag(e, fset)}
	fset.StringVar(&o.remote.Address, "address", e.getenv(addrEnv), "base `URL` of a node's API (https://host:port), instead of the socket (env "+addrEnv+")")
	fset.StringVar(&o.remote.Token, "token", e.getenv(tokenEnv), "the node's API `token`, sent as X-Nomad-Token (env "+tokenEnv+")")
	fset.StringVar(&o.remote.CACert, "ca-cert", e.getenv(caCertEnv), "PEM `file` of the CA that signed the node's certificate (env "+caCertEnv+")")
	fset.StringVar(&o.remote.ClientCert, "client-cert", e.getenv(clientCertEnv), "PEM `file` of this client's certificate, for mutual TLS (env "+clientCertEnv+")")
	fset.StringVar(&o.remote.ClientKey, "client-key", e.getenv(clientKeyEnv), "PEM `file` of the client certificate's key (env "+clientKeyEnv+")")
	return o
}

// dial returns a client of the daemon o names and the context of one
// client command, cancelled by SIGINT or SIGTERM so that an interrupted
// command stops waiting; done releases both.
func (o *clientOptions) dial() (context.Context, *api.Client, func(), error) {
	c := api.NewClient(*o.socket)
	if o.remote.Address != "" {
		var err error
		if c, err = api.NewRemoteClient(o.remote); err != nil {
			return nil, nil, nil, err
		}
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	return ctx, c, func() {
		c.Close()
		cancel()
	}, nil
}

// dial is clientOptions.dial for a command that needs the control
// socket.
func dial(socket string) (context.Context, *api.Client, func()) {
	ctx, c, done, _ := (&clientOptions{socket: &socket}).dial()
	return ctx, c, done
}

// minPrefix is the shortest ID prefix accepted, as in Nomad.
const minPrefix = 2

// resolveAlloc turns an allocation ID or a unique prefix of one into the
// allocation's stub, as Nomad's CLI does: an exact ID wins, a prefix
// must be at least two characters and match one allocation, and an
// ambiguous one lists what it matched.
func resolveAlloc(ctx context.Context, c *api.Client, prefix string) (*api.AllocStub, error) {
	if err := checkAllocID(prefix); err != nil {
		return nil, err
	}
	stubs, err := c.AllocStubs(ctx, prefix)
	if err != nil {
		return nil, err
	}
	for i := range stubs {
		if stubs[i].ID == prefix {
			return &stubs[i], nil
		}
	}
	switch {
	case len(stubs) == 0:
		return nil, fmt.Errorf("%w %q: no allocation has that ID or an ID that starts with it", allocdir.ErrUnknownAlloc, prefix)
	case len(prefix) < minPrefix:
		return nil, fmt.Errorf("allocation prefix %q is too short: give at least %d characters", prefix, minPrefix)
	case len(stubs) == 1:
		return &stubs[0], nil
	}
	ids := make([]string, 0, len(stubs))
	for _, s := range stubs {
		ids = append(ids, fmt.Sprintf("  %s  %s  tasks: %s", s.ID, s.ClientStatus, strings.Join(stubTasks(&s), ", ")))
	}
	return nil, fmt.Errorf("prefix %q matched %d allocations; give more of the ID:\n%s", prefix, len(stubs), strings.Join(ids, "\n"))
}

// stubTasks returns the task names of an allocation stub, sorted.
func stubTasks(s *api.AllocStub) []string {
	names := make([]string, 0, len(s.TaskStates))
	for name := range s.TaskStates {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

// resolveTask returns the task a command names, or the allocation's only
// task when it names none.
func resolveTask(s *api.AllocStub, task string) (string, error) {
	tasks := stubTasks(s)
	if task == "" {
		if len(tasks) == 1 {
			return tasks[0], nil
		}
		return "", fmt.Errorf("allocation %q has %d tasks (%s): name one", s.ID, len(tasks), strings.Join(tasks, ", "))
	}
	if err := allocdir.ValidTaskName(task); err != nil {
		return "", fmt.Errorf("invalid task name: %w", err)
	}
	if _, ok := s.TaskStates[task]; !ok {
		return "", fmt.Errorf("allocation %q has no task %q; its tasks: %s", s.ID, task, strings.Join(tasks, ", "))
	}
	return task, nil
}

// parseNomadFlags is parseFlags for commands that take Nomad's spelling
// of long flags with one dash (-stat, -json, -address): any single-dash
// word that names a long flag of fset counts as that flag. Single letters
// (-f, -n 5) are shorthands already; everything after "--" is left alone.
func parseNomadFlags(fset *pflag.FlagSet, args []string, minArgs, maxArgs int) error {
	out := make([]string, 0, len(args))
	for i, a := range args {
		if a == "--" {
			out = append(out, args[i:]...)
			break
		}
		if strings.HasPrefix(a, "-") && !strings.HasPrefix(a, "--") {
			name, _, _ := strings.Cut(a[1:], "=")
			if len(name) > 1 && fset.Lookup(name) != nil {
				a = "-" + a
			}
		}
		out = append(out, a)
	}
	return parseFlags(fset, out, minArgs, maxArgs)
}

// resolveID is resolveAlloc for commands that need only the ID. What
// matches nothing is passed on as it is, so that the daemon says what
// became of it (unknown, or collected).
func resolveID(ctx context.Context, c *api.Client, prefix string) (string, error) {
	s, err := resolveAlloc(ctx, c, prefix)
	if errors.Is(err, allocdir.ErrUnknownAlloc) {
		return prefix, nil
	}
	if err != nil {
		return "", err
	}
	return s.ID, nil
}
