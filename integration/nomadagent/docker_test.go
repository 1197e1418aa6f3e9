package nomadagent

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/allocfs/allocfs/allocdir/allocdirtest"
	"github.com/allocfs/allocfs/fs/fstest"
)

// testImage is the image the docker test imports: the host's static
// busybox and a few of its applets, nothing pulled. Its tag is not
// "latest": Nomad's docker driver pulls a latest image whatever
// force_pull says.
const testImage = "allocfs-nomad-test/busybox:local"

// dockerd is a Docker engine of the test's own.
type dockerd struct {
	dir, socket string
	hc          *http.Client
}

// startDockerd starts a dockerd of the test's own, away from any the
// machine runs: its data root, exec root, pidfile and socket in a
// temporary directory, no iptables rules, no bridge and no forwarding,
// so nothing reaches the network and the host's firewall stays as it
// was. Cleanup stops it (and its containerd) by PID and detaches what it
// mounted; it runs after the Nomad agent's, which needs the engine to
// stop its containers.
func startDockerd(t *testing.T) *dockerd {
	t.Helper()
	requireAgentTests(t)
	for _, bin := range []string{"dockerd", "containerd", "runc"} {
		if _, err := exec.LookPath(bin); err != nil {
			fstest.Lacks(t, "%s (apt-get install docker.io): %v", bin, err)
		}
	}
	dir, err := os.MkdirTemp("", "allocfs-dockerd-")
	if err != nil {
		t.Fatal(err)
	}
	dir, _ = filepath.EvalSymlinks(dir)
	t.Cleanup(func() { removeTop(t, dir) })
	d := &dockerd{dir: dir, socket: filepath.Join(dir, "docker.sock")}
	d.hc = &http.Client{
		Timeout: time.Minute,
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", d.socket)
		}},
	}
	// An empty configuration file: the host's /etc/docker/daemon.json is
	// not the test's.
	cfg := filepath.Join(dir, "daemon.json")
	if err := os.WriteFile(cfg, []byte("{}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := &allocdirtest.SyncBuffer{}
	cmd := exec.Command("dockerd",
		"--config-file", cfg,
		"--data-root", filepath.Join(dir, "root"),
		"--exec-root", filepath.Join(dir, "exec"),
		"--pidfile", filepath.Join(dir, "docker.pid"),
		"--host", "unix://"+d.socket,
		"--iptables=false", "--ip6tables=false", "--bridge=none", "--ip-forward=false", "--userland-proxy=false")
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start dockerd: %v", err)
	}
	done := make(chan struct{})
	go func() {
		cmd.Wait()
		close(done)
	}()
	t.Cleanup(func() {
		procs := descendants(cmd.Process.Pid)
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		for _, p := range procs {
			p.kill()
		}
		detachBelow(t, dir)
		if t.Failed() {
			t.Logf("dockerd output:\n%s", out)
		}
	})
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		select {
		case <-done:
			t.Fatalf("dockerd exited early: %v\n%s", cmd.ProcessState, out)
		default:
		}
		if code, body, err := d.call(http.MethodGet, "/_ping", "", nil); err == nil && code == http.StatusOK && body == "OK" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("dockerd not answering on %s within a minute:\n%s", d.socket, out)
		}
	}
	return d
}

// endpoint is the engine's address as Nomad's docker plugin takes it.
func (d *dockerd) endpoint() string { return "unix://" + d.socket }

// call sends one request to the engine's API.
func (d *dockerd) call(method, path, contentType string, body io.Reader) (int, string, error) {
	req, err := http.NewRequest(method, "http://docker"+path, body)
	if err != nil {
		return 0, "", fmt.Errorf("docker %s %s: %w", method, path, err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := d.hc.Do(req)
	if err != nil {
		return 0, "", fmt.Errorf("docker %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, "", fmt.Errorf("docker %s %s: read the answer: %w", method, path, err)
	}
	return resp.StatusCode, string(b), nil
}

// importBusybox makes testImage from a tar of the host's static busybox
// and links to it for the applets the job uses (what `docker import`
// does), so that the test never pulls.
func (d *dockerd) importBusybox(t *testing.T) {
	t.Helper()
	bb, err := os.ReadFile(staticBusybox(t))
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, dir := range []string{"bin/", "tmp/"} {
		if err := tw.WriteHeader(&tar.Header{Name: dir, Mode: 0o1777, Typeflag: tar.TypeDir}); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.WriteHeader(&tar.Header{Name: "bin/busybox", Mode: 0o755, Size: int64(len(bb)), Typeflag: tar.TypeReg}); err != nil {
		t.Fatal(err)
	}
	if _, err := tw.Write(bb); err != nil {
		t.Fatal(err)
	}
	for _, applet := range []string{"sh", "echo", "cat", "ls", "mkdir", "sleep"} {
		if err := tw.WriteHeader(&tar.Header{Name: "bin/" + applet, Linkname: "busybox", Mode: 0o777, Typeflag: tar.TypeSymlink}); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	repo, tag, _ := strings.Cut(testImage, ":")
	code, body, err := d.call(http.MethodPost, "/images/create?fromSrc=-&repo="+repo+"&tag="+tag, "application/x-tar", &buf)
	if err != nil || code != http.StatusOK {
		t.Fatalf("import %s: %d %s %v", testImage, code, body, err)
	}
	// The answer is a stream of progress messages; a failure is one of
	// them, with the status still 200.
	dec := json.NewDecoder(strings.NewReader(body))
	for dec.More() {
		var msg struct{ Error string }
		if err := dec.Decode(&msg); err != nil {
			t.Fatalf("import %s: the engine's answer: %v\n%s", testImage, err, body)
		}
		if msg.Error != "" {
			t.Fatalf("import %s: %s", testImage, msg.Error)
		}
	}
	if code, body, err := d.call(http.MethodGet, "/images/"+testImage+"/json", "", nil); err != nil || code != http.StatusOK {
		t.Fatalf("inspect %s after its import: %d %s %v", testImage, code, body, err)
	}
}

// TestDocker: a docker container, its image imported into the test's own
// engine, writes into its local/, alloc/data and ${NOMAD_ALLOC_DIR}
// itself (where tasks leave ready files for each other), which Nomad
// binds from the mount, and to stdout, which Nomad's docker logger
// carries into alloc/logs.
func TestDocker(t *testing.T) {
	d := startDockerd(t)
	d.importBusybox(t)
	n := startNode(t, nodeOpts{docker: d.endpoint(), drivers: []string{"docker"}})
	start := time.Now()
	// The driver's log collector attaches once the container runs: a
	// container that prints and exits at once can beat it, and its
	// output reaches no log, whatever alloc_dir is on. It waits a moment.
	job := n.runJob(t, batchJob("docker", fmt.Sprintf(`
      driver = "docker"
      config {
        image        = %q
        force_pull   = false
        network_mode = "none"
        command      = "/bin/sh"
        args         = ["-c", "sleep 2; echo docker-local > \"$NOMAD_TASK_DIR/out.txt\"; echo docker-data > \"$NOMAD_ALLOC_DIR/data/docker.txt\"; echo docker-alloc > \"$NOMAD_ALLOC_DIR/docker.txt\"; cat \"$NOMAD_TASK_DIR/out.txt\"; echo docker-stdout"]
      }`, testImage)))
	a := n.waitAlloc(t, job, nil, "complete")
	n.stderrOnFailure(t, a.ID, "t")
	t.Logf("the container ran and completed %v after its job was registered", time.Since(start).Round(time.Millisecond))
	n.wantFile(t, a.ID+"/t/local/out.txt", "docker-local\n")
	n.wantFile(t, a.ID+"/alloc/data/docker.txt", "docker-data\n")
	n.wantFile(t, a.ID+"/alloc/docker.txt", "docker-alloc\n")
	want := "docker-local\ndocker-stdout\n"
	if got := n.logs(t, a.ID, "t", "stdout", want); got != want {
		t.Errorf("the container's stdout through the agent: %q, want %q", got, want)
	}
	n.wantFile(t, a.ID+"/alloc/logs/t.stdout.0", want)
}
