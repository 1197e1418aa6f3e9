package integration

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/allocfs/allocfs/fs/fstest"
)

// testCA is a certificate authority made for one test.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue signs a leaf certificate for a server (on 127.0.0.1 and ips) or a
// client and returns it with its key, in PEM.
func (ca *testCA) issue(t *testing.T, serial int64, server bool, ips ...string) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: "allocfs test"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
		for _, ip := range ips {
			tmpl.IPAddresses = append(tmpl.IPAddresses, net.ParseIP(ip))
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

// secretWriter returns a function that writes a 0600 file into a fresh
// temporary directory and returns its path.
func secretWriter(t *testing.T) func(name string, b []byte) string {
	dir := t.TempDir()
	return func(name string, b []byte) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
}

// TestClientAPIMutualTLS serves the client API over mutual TLS and checks
// that only a client with a certificate from the configured CA and the
// token gets an answer.
func TestClientAPIMutualTLS(t *testing.T) {
	fstest.RequireFUSE(t)
	write := secretWriter(t)
	ca := newTestCA(t, "cluster CA")
	srvCert, srvKey := ca.issue(t, 2, true)
	cliCert, cliKey := ca.issue(t, 3, false)
	other := newTestCA(t, "some other CA")
	strangerCert, strangerKey := other.issue(t, 4, false)

	addr := freeAddr(t)
	n := startNodeWith(t, nil, "--http-addr", addr,
		"--token-file", write("token", []byte(apiToken)),
		"--tls-cert", write("srv.pem", srvCert), "--tls-key", write("srv.key", srvKey),
		"--tls-ca", write("ca.pem", ca.pem))
	n.mustCLI(t, "alloc", "create", "a1", "--task", "web")
	if err := os.WriteFile(filepath.Join(n.mnt, "a1/alloc/data/f"), []byte("over tls"), 0o644); err != nil {
		t.Fatal(err)
	}

	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.pem)
	client := func(certPEM, keyPEM []byte) *http.Client {
		cfg := &tls.Config{RootCAs: roots}
		if certPEM != nil {
			pair, err := tls.X509KeyPair(certPEM, keyPEM)
			if err != nil {
				t.Fatal(err)
			}
			cfg.Certificates = []tls.Certificate{pair}
		}
		return &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}, Timeout: 10 * time.Second}
	}
	url := "https://" + addr + "/v1/client/fs/cat/a1?path=alloc/data/f"
	get := func(c *http.Client, token string) (int, string, error) {
		req, err := http.NewRequest(http.MethodGet, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set("X-Nomad-Token", token)
		}
		resp, err := c.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), nil
	}

	if code, body, err := get(client(cliCert, cliKey), apiToken); err != nil || code != 200 || body != "over tls" {
		t.Errorf("trusted client with the token: %d %q %v; want 200 and the file", code, body, err)
	}
	if code, _, err := get(client(cliCert, cliKey), ""); err != nil || code != 403 {
		t.Errorf("trusted client without the token: %d %v; want 403", code, err)
	}
	if strings.Contains(n.Out.String(), "plain HTTP") {
		t.Errorf("a node serving TLS warned of plain HTTP:\n%s", n.Out)
	}
	if _, _, err := get(client(nil, nil), apiToken); err == nil {
		t.Error("a client with no certificate was answered; want the handshake refused")
	}
	if _, _, err := get(client(strangerCert, strangerKey), apiToken); err == nil {
		t.Error("a client with a certificate from another CA was answered; want the handshake refused")
	}
	plain := &http.Client{Timeout: 10 * time.Second}
	resp, err := plain.Get("http://" + addr + "/v1/client/fs/cat/a1?path=alloc/data/f")
	if err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == 200 {
			t.Errorf("plain HTTP to the TLS port: 200 %q; want a refusal", b)
		}
	}
}

// TestMigrationOverMutualTLS: a node fetches a snapshot from another over
// mutual TLS, each presenting a certificate of the cluster's CA; a node
// without the CA's certificate gets nothing, and nothing is left behind.
func TestMigrationOverMutualTLS(t *testing.T) {
	fstest.RequireFUSE(t)
	write := secretWriter(t)
	ca := newTestCA(t, "cluster CA")
	srvCert, srvKey := ca.issue(t, 2, true)
	cliCert, cliKey := ca.issue(t, 3, false)
	other := newTestCA(t, "some other CA")
	strangerCert, strangerKey := other.issue(t, 4, false)
	token := write("token", []byte("cluster-token"))

	addr := freeAddr(t)
	src := startNodeWith(t, nil, "--http-addr", addr, "--migrate-token-file", token,
		"--tls-cert", write("srv.pem", srvCert), "--tls-key", write("srv.key", srvKey), "--tls-ca", write("ca.pem", ca.pem))
	src.mustCLI(t, "alloc", "create", "A", "--task", "web")
	if err := os.WriteFile(filepath.Join(src.mnt, "A/alloc/data/f"), []byte("over mutual tls"), 0o644); err != nil {
		t.Fatal(err)
	}
	src.mustCLI(t, "alloc", "stop", "A")
	from := "https://" + addr

	stranger := startNodeWith(t, nil, "--tls-cert", write("str.pem", strangerCert), "--tls-key", write("str.key", strangerKey),
		"--tls-ca", write("other.pem", other.pem))
	r := stranger.cli(t, "alloc", "create", "B", "--task", "web", "--previous", "A", "--migrate", "--from", from, "--token-file", token)
	if r.code == 0 {
		t.Errorf("a node of another CA fetched the snapshot")
	}
	if entries, err := os.ReadDir(filepath.Join(stranger.dataDir, "staging")); err != nil || len(entries) != 0 {
		t.Errorf("staging after the refused fetch: %v, %v; want empty", entries, err)
	}

	dst := startNodeWith(t, nil, "--tls-cert", write("cli.pem", cliCert), "--tls-key", write("cli.key", cliKey), "--tls-ca", write("ca2.pem", ca.pem))
	dst.mustCLI(t, "alloc", "create", "B", "--task", "web", "--previous", "A", "--migrate", "--from", from, "--token-file", token)
	if b, err := os.ReadFile(filepath.Join(dst.mnt, "B/alloc/data/f")); err != nil || string(b) != "over mutual tls" {
		t.Errorf("B's data: %q, %v; want A's", b, err)
	}
}
