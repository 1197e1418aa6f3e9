package node

import (
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/allocfs/allocfs/fs/store"
	"github.com/allocfs/allocfs/fs/store/record"
	"github.com/hashicorp/go-hclog"
	nomadapi "github.com/hashicorp/nomad/api"
)

// NomadSizes gives each allocation Nomad's client makes through the
// mount the disk limit Nomad placed it by: its task group's
// ephemeral_disk.size, read from Nomad's HTTP API with Nomad's own Go
// client. Nomad's client makes an allocation's directory only once the
// servers placed it, so the allocation is there to be read; until the
// answer comes (a few milliseconds from the local agent), the
// allocation has the node's default limit, if any.
//
// Each allocation is asked for on a goroutine of its own, retried with
// a growing pause while Nomad does not answer; an allocation Nomad does
// not know (404) is left with the default, and the log says so.
type NomadSizes struct {
	logger hclog.Logger
	store  *store.Store
	client *nomadapi.Client
	// Attempts and Pause bound the retries of one allocation: Pause
	// doubles after each failed attempt.
	Attempts int
	Pause    time.Duration

	mu     sync.Mutex
	closed bool
	stop   chan struct{}
	wg     sync.WaitGroup
}

// NewNomadSizes reads sizes from the Nomad agent cfg points at (its
// Address, SecretID and TLS settings; nomadapi.DefaultConfig reads them
// from the NOMAD_* variables).
func NewNomadSizes(logger hclog.Logger, s *store.Store, cfg *nomadapi.Config) (*NomadSizes, error) {
	c, err := nomadapi.NewClient(cfg)
	if err != nil {
		return nil, fmt.Errorf("failed to make Nomad's API client for %s: %w", cfg.Address, err)
	}
	return &NomadSizes{
		logger:   logger.Named("nomad-sizes"),
		store:    s,
		client:   c,
		Attempts: 8,
		Pause:    250 * time.Millisecond,
		stop:     make(chan struct{}),
	}, nil
}

// Created asks Nomad the size of allocation id in the background: the
// mount's hook (fs.MountOptions.Created), which must not block.
func (n *NomadSizes) Created(id string) {
	if n == nil {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return
	}
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		n.size(id)
	}()
}

// Resume asks again for every allocation Nomad's client made whose limit
// did not come from Nomad: those a previous daemon had not sized yet
// when it stopped.
func (n *NomadSizes) Resume() {
	if n == nil {
		return
	}
	for _, st := range n.store.List() {
		if st.Origin == record.OriginMount && st.Status == record.StatusRunning && (st.Disk == nil || st.Disk.From != record.FromNomad) {
			n.Created(st.ID)
		}
	}
}

// Close stops asking and waits for the requests under way.
func (n *NomadSizes) Close() {
	if n == nil {
		return
	}
	n.mu.Lock()
	if !n.closed {
		n.closed = true
		close(n.stop)
	}
	n.mu.Unlock()
	n.wg.Wait()
}

// errNotNomads: Nomad does not know the allocation.
var errNotNomads = errors.New("no such allocation in Nomad")

// size reads allocation id's size from Nomad and sets it as its limit.
func (n *NomadSizes) size(id string) {
	pause := n.Pause
	var mb int64
	var err error
	for attempt := 1; ; attempt++ {
		mb, err = n.SizeOf(id)
		if err == nil || errors.Is(err, errNotNomads) || attempt >= n.Attempts {
			break
		}
		n.logger.Debug("Nomad did not give an allocation's size; trying again", "alloc_id", id, "attempt", attempt, "error", err)
		select {
		case <-n.stop:
			return
		case <-time.After(pause):
		}
		pause *= 2
	}
	switch {
	case err != nil:
		n.logger.Warn("no size from Nomad for an allocation its client made; it keeps the node's default limit", "alloc_id", id, "error", err)
		return
	case mb <= 0:
		n.logger.Info("Nomad gives the allocation no disk size; it keeps the node's default limit", "alloc_id", id)
		return
	}
	if _, err := n.store.SetLimit(id, record.Limit{Bytes: mb << 20}, record.FromNomad); err != nil {
		n.logger.Warn("failed to set the size Nomad gives an allocation", "alloc_id", id, "disk_mb", mb, "error", err)
		return
	}
	n.logger.Info("allocation sized by Nomad's ephemeral_disk.size", "alloc_id", id, "disk_mb", mb)
}

// SizeOf returns the disk size, in MB, Nomad placed allocation id by:
// the shared disk of its allocated resources, or its task group's
// ephemeral_disk.size.
func (n *NomadSizes) SizeOf(id string) (int64, error) {
	alloc, _, err := n.client.Allocations().Info(id, nil)
	if err != nil {
		var ue nomadapi.UnexpectedResponseError
		if errors.As(err, &ue) && ue.StatusCode() == http.StatusNotFound {
			return 0, fmt.Errorf("%w: %s", errNotNomads, id)
		}
		return 0, fmt.Errorf("failed to read allocation %s from Nomad: %w", id, err)
	}
	if r := alloc.AllocatedResources; r != nil && r.Shared.DiskMB > 0 {
		return r.Shared.DiskMB, nil
	}
	if alloc.Job != nil {
		for _, tg := range alloc.Job.TaskGroups {
			if tg.Name != nil && *tg.Name == alloc.TaskGroup && tg.EphemeralDisk != nil && tg.EphemeralDisk.SizeMB != nil {
				return int64(*tg.EphemeralDisk.SizeMB), nil
			}
		}
	}
	return 0, nil
}
