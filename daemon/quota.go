//go:build linux

package daemon

import (
	"fmt"
	"os"
	"strings"

	"github.com/allocfs/allocfs/fs/store"
	"github.com/allocfs/allocfs/node"
	"github.com/hashicorp/go-hclog"
	nomadapi "github.com/hashicorp/nomad/api"
)

// logQuota says once, at start, whether disk limits are enforced, and
// where they are not, what would enforce them.
func logQuota(logger hclog.Logger, s *store.Store) {
	r := s.Quota()
	if r.Enforced() {
		logger.Info("allocations' disk limits are enforced", "mechanism", r.Mechanism, "filesystem", r.Filesystem,
			"default_limit_mb", s.DefaultLimit().Bytes>>20)
		return
	}
	logger.Info("allocations' disk limits are not enforced: an allocation that asks for one is refused", "filesystem", r.Filesystem, "how_to_enable", r.Why)
}

// startNomadSizes makes what reads allocations' sizes from the Nomad
// agent at addr, or nil without one, or where nothing could enforce them
// (said once).
func startNomadSizes(logger hclog.Logger, s *store.Store, addr, tokenFile string) (*node.NomadSizes, error) {
	if addr == "" {
		return nil, nil
	}
	if !s.Quota().Enforced() {
		logger.Warn("--nomad-addr is set, but disk limits are not enforced here: Nomad's sizes are not read", "how_to_enable", s.Quota().Why)
		return nil, nil
	}
	cfg := nomadapi.DefaultConfig()
	cfg.Address = addr
	if tokenFile != "" {
		b, err := os.ReadFile(tokenFile)
		if err != nil {
			return nil, fmt.Errorf("failed to read --nomad-token-file: %w", err)
		}
		cfg.SecretID = strings.TrimSpace(string(b))
	}
	sizes, err := node.NewNomadSizes(logger, s, cfg)
	if err != nil {
		return nil, err
	}
	logger.Info("allocations Nomad's client makes take their size from Nomad", "nomad_addr", addr)
	return sizes, nil
}
