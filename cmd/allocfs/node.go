package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"

	"github.com/allocfs/allocfs/api/netlimit"
	"github.com/allocfs/allocfs/migrate"
)

// nodeConfig is what the TCP listener serves and how it is secured.
type nodeConfig struct {
	// addr is the TCP address; empty: no TCP listener.
	addr string
	// migrateTokens, when not nil, admits snapshot requests
	// (GET /v1/client/allocation/<id>/snapshot).
	migrateTokens migrate.TokenChecker
	// apiToken, when set, admits requests to the client API
	// (/v1/client/fs/*, the GC endpoints); without it that API is not
	// served on TCP at all.
	apiToken string
	// TLS: cert and key turn TLS on; ca makes client certificates signed
	// by it mandatory (mutual TLS).
	tlsCert, tlsKey, tlsCA string
}

// load reads the token files named on the command line and checks that
// the TCP settings make sense together.
func (c *nodeConfig) load(migrateTokenFile, nodeSecretFile, apiTokenFile string) error {
	if _, err := c.tlsConfig(); err != nil {
		return err
	}
	if c.addr == "" {
		// The TLS flags also serve this node's own fetches; the tokens
		// only guard the listener.
		for _, f := range []struct{ flag, value string }{
			{"--migrate-token-file", migrateTokenFile}, {"--node-secret-file", nodeSecretFile}, {"--token-file", apiTokenFile},
		} {
			if f.value != "" {
				return fmt.Errorf("%s needs --http-addr", f.flag)
			}
		}
		return nil
	}
	if migrateTokenFile == "" && nodeSecretFile == "" && apiTokenFile == "" {
		return fmt.Errorf("--http-addr needs --migrate-token-file, --node-secret-file or --token-file: nothing is served over TCP without a token")
	}
	var checkers migrate.AnyToken
	if migrateTokenFile != "" {
		t, err := readSecretFile("migration token", migrateTokenFile)
		if err != nil {
			return err
		}
		checkers = append(checkers, migrate.SharedToken(t))
	}
	if nodeSecretFile != "" {
		t, err := readSecretFile("node secret", nodeSecretFile)
		if err != nil {
			return err
		}
		if err := migrate.NodeSecretToken(t).Validate(); err != nil {
			return err
		}
		checkers = append(checkers, migrate.NodeSecretToken(t))
	}
	if len(checkers) > 0 {
		c.migrateTokens = checkers
	}
	if apiTokenFile != "" {
		t, err := readSecretFile("API token", apiTokenFile)
		if err != nil {
			return err
		}
		c.apiToken = t
	}
	return nil
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

// tlsConfig returns the listener's TLS configuration, or nil for plain
// TCP: this node's certificate, and with a CA, client certificates
// required and checked against it.
func (c nodeConfig) tlsConfig() (*tls.Config, error) {
	cert, pool, err := c.tlsMaterial()
	if err != nil || cert == nil {
		return nil, err
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{*cert}, MinVersion: tls.VersionTLS12}
	if pool != nil {
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

// fetchTLSConfig returns the TLS configuration of this node's fetches
// from other nodes, which run the same setup: the CA authenticates them
// and this node's certificate is its client certificate. nil means
// Go's defaults (the system's roots, no client certificate).
func (c nodeConfig) fetchTLSConfig() (*tls.Config, error) {
	cert, pool, err := c.tlsMaterial()
	if err != nil || cert == nil {
		return nil, err
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{*cert}, RootCAs: pool, MinVersion: tls.VersionTLS12}
	return cfg, nil
}

// tlsMaterial loads the key pair and the CA the TLS flags name; no
// certificate means no TLS.
func (c nodeConfig) tlsMaterial() (*tls.Certificate, *x509.CertPool, error) {
	if c.tlsCert == "" && c.tlsKey == "" {
		if c.tlsCA != "" {
			return nil, nil, fmt.Errorf("--tls-ca needs --tls-cert and --tls-key")
		}
		return nil, nil, nil
	}
	if c.tlsCert == "" || c.tlsKey == "" {
		return nil, nil, fmt.Errorf("--tls-cert and --tls-key go together")
	}
	cert, err := tls.LoadX509KeyPair(c.tlsCert, c.tlsKey)
	if err != nil {
		return nil, nil, fmt.Errorf("failed to load the TLS key pair: %w", err)
	}
	if c.tlsCA == "" {
		return &cert, nil, nil
	}
	pem, err := os.ReadFile(c.tlsCA)
	if err != nil {
		return nil, nil, fmt.Errorf("failed to read the TLS CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, nil, fmt.Errorf("no PEM certificate in the TLS CA file %q", c.tlsCA)
	}
	return &cert, pool, nil
}

// nodeHandler is what other machines reach over TCP: snapshots behind the
// migration token, the client API behind the API token, nothing else (the
// control API stays on the unix socket). Refusals are logged through
// refusals, at a bounded rate: anyone who can connect can cause them.
func nodeHandler(refusals *netlimit.LogLimiter, cfg nodeConfig, snapshots, client http.Handler) http.Handler {
	mux := http.NewServeMux()
	if cfg.migrateTokens != nil {
		mux.Handle("GET /v1/client/allocation/{id}/snapshot", requireSnapshotToken(refusals, cfg.migrateTokens, snapshots))
	}
	if cfg.apiToken != "" {
		mux.Handle("/v1/client/", requireToken(refusals, cfg.apiToken, client))
	}
	return mux
}

// requireToken admits requests that present token as X-Nomad-Token or as
// an "Authorization: Bearer" header, as Nomad's API does, and answers 403
// to the rest.
func requireToken(refusals *netlimit.LogLimiter, token string, next http.Handler) http.Handler {
	check := migrate.SharedToken(token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !check.Check("", migrate.RequestToken(r)) {
			refusals.Warn("token/client_api", "refused a client API request: bad or missing token", "remote", r.RemoteAddr, "path", r.URL.Path)
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.WriteHeader(http.StatusForbidden)
			io.WriteString(w, "Permission denied")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// requireSnapshotToken answers 403 to a snapshot request whose token tokens
// refuse for the allocation it names. The snapshot handler checks again,
// but logs every refusal; checked here first, refusals are logged at a
// bounded rate.
func requireSnapshotToken(refusals *netlimit.LogLimiter, tokens migrate.TokenChecker, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token := migrate.RequestToken(r)
		if token == "" || !tokens.Check(r.PathValue("id"), token) {
			refusals.Warn("token/snapshot", "refused a snapshot request: bad or missing token", "remote", r.RemoteAddr, "path", r.URL.Path)
			// The snapshot handler's own answer, word for word.
			http.Error(w, "Permission denied", http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, r)
	})
}
