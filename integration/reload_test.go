package integration

import (
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/allocfs/allocfs/fs/fstest"
	"github.com/allocfs/allocfs/integration/harness"
)

// TestSIGHUPReloads: SIGHUP leaves the daemon and its mount running and
// applies a new log level from --config's file, a rotated API token and
// a rotated TLS certificate; a reload that cannot parse changes nothing,
// and a flag only a start applies is reported as such.
func TestSIGHUPReloads(t *testing.T) {
	fstest.RequireFUSE(t)
	write := secretWriter(t)
	ca := newTestCA(t, "cluster CA")
	cert1, key1 := ca.issue(t, 21, true)
	cert2, key2 := ca.issue(t, 22, true)
	cliCert, cliKey := ca.issue(t, 23, false)
	config := write("serve.flags", []byte("# allocfs serve\n--log-level=info\n"))
	token := write("token", []byte("token-one"))
	certFile, keyFile := write("srv.pem", cert1), write("srv.key", key1)

	addr := freeAddr(t)
	n := startNodeWith(t, nil, "--config", config, "--http-addr", addr, "--token-file", token,
		"--tls-cert", certFile, "--tls-key", keyFile, "--tls-ca", write("ca.pem", ca.pem))
	n.mustCLI(t, "alloc", "create", "a1", "--task", "web")
	if err := os.WriteFile(filepath.Join(n.mnt, "a1/alloc/data/f"), []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}

	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.pem)
	pair, err := tls.X509KeyPair(cliCert, cliKey)
	if err != nil {
		t.Fatal(err)
	}
	// A fresh connection each time, so that each sees the certificate
	// served at that moment.
	get := func(tok string) (code int, serial int64) {
		t.Helper()
		tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{pair}}, DisableKeepAlives: true}
		defer tr.CloseIdleConnections()
		req, err := http.NewRequest(http.MethodGet, "https://"+addr+"/v1/client/fs/cat/a1?path=alloc/data/f", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-Nomad-Token", tok)
		resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Do(req)
		if err != nil {
			t.Fatalf("GET with token %q: %v", tok, err)
		}
		resp.Body.Close()
		return resp.StatusCode, resp.TLS.PeerCertificates[0].SerialNumber.Int64()
	}
	requestLines := func() int { return strings.Count(n.Out.String(), "request: method=") }
	hup := func(what string) {
		t.Helper()
		before := strings.Count(n.Out.String(), "reload")
		if err := syscall.Kill(n.Pid(), syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(harness.Timeout)
		for strings.Count(n.Out.String(), "reload") == before {
			if time.Now().After(deadline) {
				t.Fatalf("%s: no reload in the log within %v", what, harness.Timeout)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	if code, serial := get("token-one"); code != 200 || serial != 21 {
		t.Fatalf("before the reload: %d from certificate %d, want 200 from 21", code, serial)
	}
	n.mustCLI(t, "alloc", "list")
	if c := requestLines(); c != 0 {
		t.Fatalf("at level info the log has %d debug request lines", c)
	}

	// Rotate everything, then SIGHUP.
	if err := os.WriteFile(config, []byte("--log-level=debug\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	write("token", []byte("token-two"))
	write("srv.pem", cert2)
	write("srv.key", key2)
	hup("rotation")
	if code, serial := get("token-two"); code != 200 || serial != 22 {
		t.Errorf("after the reload, new token: %d from certificate %d, want 200 from 22", code, serial)
	}
	if code, _ := get("token-one"); code != 403 {
		t.Errorf("after the reload, old token: %d, want 403", code)
	}
	n.mustCLI(t, "alloc", "list")
	if requestLines() == 0 {
		t.Errorf("after a reload to debug, an API request wrote no debug line")
	}

	// A file that does not parse changes nothing.
	if err := os.WriteFile(config, []byte("--log-level=loud\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	write("token", []byte("token-three"))
	hup("bad config")
	if !strings.Contains(n.Out.String(), "reload failed") {
		t.Errorf("a config that does not parse: no \"reload failed\" line")
	}
	if code, _ := get("token-two"); code != 200 {
		t.Errorf("after a failed reload, the token in effect: %d, want 200", code)
	}

	// A flag only a start applies.
	if err := os.WriteFile(config, []byte("--log-level=debug\n--gc-max-allocs=7\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	hup("restart-only flag")
	if !strings.Contains(n.Out.String(), "take effect at the next start") || !strings.Contains(n.Out.String(), "gc-*") {
		t.Errorf("a changed --gc-max-allocs is not reported as waiting for a start")
	}
	if code, _ := get("token-three"); code != 200 {
		t.Errorf("the reload with a restart-only flag did not read the token: %d, want 200", code)
	}

	b, err := os.ReadFile(filepath.Join(n.mnt, "a1/alloc/data/f"))
	if err != nil || string(b) != "kept" {
		t.Errorf("the mount after four SIGHUPs: %q, %v", b, err)
	}
	if got := harness.MountsAt(t, n.mnt); got != 1 {
		t.Errorf("%d allocfs mounts at %s after the SIGHUPs, want 1", got, n.mnt)
	}
}
