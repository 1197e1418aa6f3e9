//go:build linux

package daemon

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"strings"
	"sync/atomic"

	"github.com/allocfs/allocfs/api"
	"github.com/allocfs/allocfs/migrate"
)

// NodeConfig is what the TCP listener serves and how it is secured: the
// address, and the files that hold its tokens and its TLS material, which
// SIGHUP reads again (NodeSecrets).
type NodeConfig struct {
	// Addr is the TCP address; empty: no TCP listener.
	Addr string
	// MigrateTokenFile and NodeSecretFile, either or both, admit
	// snapshot requests (GET /v1/client/allocation/<id>/snapshot).
	MigrateTokenFile, NodeSecretFile string
	// APITokenFile admits requests to the client API (/v1/client/fs/*,
	// the GC endpoints), the allocation stubs, the health check and the
	// metrics; without it none of them is served on TCP.
	APITokenFile string
	// TLS: cert and key turn TLS on; CA makes client certificates signed
	// by it mandatory (mutual TLS).
	TLSCert, TLSKey, TLSCA string
}

// NodeSecrets is what the files of a NodeConfig held when they were read.
type NodeSecrets struct {
	// migrateTokens admits snapshot requests; nil when no file names one.
	migrateTokens migrate.TokenChecker
	// apiToken admits client API requests; "" when no file names it.
	apiToken string
	// serverTLS is the listener's TLS (nil: plain TCP) and fetchTLS that
	// of this node's fetches from others (nil: Go's defaults).
	serverTLS, fetchTLS *tls.Config
}

// check refuses combinations of the TCP flags that make no sense.
func (c NodeConfig) check() error {
	if c.Addr == "" {
		// The TLS flags also serve this node's own fetches; the tokens
		// only guard the listener.
		for _, f := range []struct{ flag, value string }{
			{"--migrate-token-file", c.MigrateTokenFile}, {"--node-secret-file", c.NodeSecretFile}, {"--token-file", c.APITokenFile},
		} {
			if f.value != "" {
				return fmt.Errorf("%s needs --http-addr", f.flag)
			}
		}
		return nil
	}
	if c.MigrateTokenFile == "" && c.NodeSecretFile == "" && c.APITokenFile == "" {
		return fmt.Errorf("--http-addr needs --migrate-token-file, --node-secret-file or --token-file: nothing is served over TCP without a token")
	}
	return nil
}

// load reads the token and TLS files the configuration names.
func (c NodeConfig) Load() (*NodeSecrets, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	var out NodeSecrets
	var err error
	if out.serverTLS, out.fetchTLS, err = c.tlsConfigs(); err != nil {
		return nil, err
	}
	var checkers migrate.AnyToken
	if c.MigrateTokenFile != "" {
		t, err := readSecretFile("migration token", c.MigrateTokenFile)
		if err != nil {
			return nil, err
		}
		checkers = append(checkers, migrate.SharedToken(t))
	}
	if c.NodeSecretFile != "" {
		t, err := readSecretFile("node secret", c.NodeSecretFile)
		if err != nil {
			return nil, err
		}
		if err := migrate.NodeSecretToken(t).Validate(); err != nil {
			return nil, err
		}
		checkers = append(checkers, migrate.NodeSecretToken(t))
	}
	if len(checkers) > 0 {
		out.migrateTokens = checkers
	}
	if c.APITokenFile != "" {
		if out.apiToken, err = readSecretFile("API token", c.APITokenFile); err != nil {
			return nil, err
		}
	}
	return &out, nil
}

// nodeTokens is what secrets holds now, as the TCP listener's handler checks
// it at each request.
func nodeTokens(secrets *atomic.Pointer[NodeSecrets]) func() api.NodeTokens {
	return func() api.NodeTokens {
		s := secrets.Load()
		return api.NodeTokens{Snapshots: s.migrateTokens, API: s.apiToken}
	}
}

// servesSnapshots and servesClientAPI tell which routes the listener has;
// they follow the flags, so a reload changes what the tokens are, never
// which routes exist.
func (c NodeConfig) servesSnapshots() bool { return c.MigrateTokenFile != "" || c.NodeSecretFile != "" }
func (c NodeConfig) servesClientAPI() bool { return c.APITokenFile != "" }

// liveServerTLS is the listener's TLS configuration: every handshake
// takes the certificate and CA that secrets holds now, so a reload
// applies to the next connection.
func liveServerTLS(secrets *atomic.Pointer[NodeSecrets]) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return secrets.Load().serverTLS, nil
		},
	}
}

// readSecretFile returns the trimmed content of a file holding a token,
// refusing an empty one: an empty token would admit nobody, or everybody.
func readSecretFile(what, path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("failed to read the %s: %w", what, err)
	}
	s := strings.TrimSpace(string(b))
	if s == "" {
		return "", fmt.Errorf("the %s file %q is empty", what, path)
	}
	return s, nil
}

// tlsConfigs returns the listener's TLS configuration, nil for plain TCP
// (this node's certificate, and with a CA, client certificates required
// and checked against it), and that of this node's fetches from other
// nodes, which run the same setup (the CA authenticates them and this
// node's certificate is its client certificate; nil: Go's defaults).
func (c NodeConfig) tlsConfigs() (server, fetch *tls.Config, err error) {
	cert, pool, err := c.tlsMaterial()
	if err != nil || cert == nil {
		return nil, nil, err
	}
	server = &tls.Config{Certificates: []tls.Certificate{*cert}, MinVersion: tls.VersionTLS12}
	if pool != nil {
		server.ClientCAs = pool
		server.ClientAuth = tls.RequireAndVerifyClientCert
	}
	fetch = &tls.Config{Certificates: []tls.Certificate{*cert}, RootCAs: pool, MinVersion: tls.VersionTLS12}
	return server, fetch, nil
}

// tlsMaterial loads the key pair and the CA the TLS flags name; no
// certificate means no TLS.
func (c NodeConfig) tlsMaterial() (*tls.Certificate, *x509.CertPool, error) {
	if c.TLSCert == "" && c.TLSKey == "" {
		if c.TLSCA != "" {
			return nil, nil, fmt.Errorf("--tls-ca needs --tls-cert and --tls-key")
		}
		return nil, nil, nil
	}
	if c.TLSCert == "" || c.TLSKey == "" {
		return nil, nil, fmt.Errorf("--tls-cert and --tls-key go together")
	}
	cert, err := tls.LoadX509KeyPair(c.TLSCert, c.TLSKey)
	if err != nil {
		return nil, nil, fmt.Errorf("failed to load the TLS key pair: %w", err)
	}
	if c.TLSCA == "" {
		return &cert, nil, nil
	}
	pem, err := os.ReadFile(c.TLSCA)
	if err != nil {
		return nil, nil, fmt.Errorf("failed to read the TLS CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, nil, fmt.Errorf("no PEM certificate in the TLS CA file %q", c.TLSCA)
	}
	return &cert, pool, nil
}

// SameListener reports whether next can secure the running listener of
// c: same address and routes, and TLS on or off as it is. The files
// themselves, and whether client certificates are required, may change.
func (c NodeConfig) SameListener(next NodeConfig) bool {
	tlsOn := func(c NodeConfig) bool { return c.TLSCert != "" }
	return c.Addr == next.Addr && c.servesSnapshots() == next.servesSnapshots() &&
		c.servesClientAPI() == next.servesClientAPI() && tlsOn(c) == tlsOn(next)
}
