package nomadagent

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/allocfs/allocfs/fs/fstest"
	"github.com/allocfs/allocfs/integration/harness"
)

// mainJava prints a line, writes one into its local/ (the working
// directory the java driver gives it) and exits.
const mainJava = `import java.nio.file.*;

public class Main {
    public static void main(String[] args) throws Exception {
        Files.writeString(Paths.get("local/java.txt"), "java-local\n");
        System.out.println("java-stdout " + System.getenv("NOMAD_TASK_NAME"));
    }
}
`

// buildJar compiles mainJava into a runnable jar with the host's JDK and
// returns its bytes.
func buildJar(t *testing.T) []byte {
	t.Helper()
	for _, bin := range []string{"java", "javac", "jar"} {
		if _, err := exec.LookPath(bin); err != nil {
			fstest.Lacks(t, "%s (apt-get install default-jdk-headless): %v", bin, err)
		}
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "Main.java"), []byte(mainJava), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"javac", "-d", "classes", "Main.java"},
		{"jar", "--create", "--file", "hello.jar", "--main-class", "Main", "-C", "classes", "."},
	} {
		cmd := exec.Command(args[0], args[1:]...)
		cmd.Dir = dir
		if r := harness.Run(t, cmd, args[0]); r.Code != 0 {
			t.Fatalf("%v: exit %d\n%s%s", args, r.Code, r.Stdout, r.Stderr)
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, "hello.jar"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// javaChrootEnv is a chroot_env that runs the host's JVM: its home (the
// java driver runs the binary it found on the host, links resolved),
// /etc (the JDK's configuration and certificates are links into it),
// /usr/bin/java should the driver run it by that name, and the loader and
// libraries at the places the binaries look for them.
func javaChrootEnv(t *testing.T) map[string]string {
	t.Helper()
	java, err := exec.LookPath("java")
	if err == nil {
		java, err = filepath.EvalSymlinks(java)
	}
	if err != nil {
		fstest.Lacks(t, "java (apt-get install default-jdk-headless): %v", err)
	}
	env := map[string]string{
		filepath.Dir(filepath.Dir(java)): filepath.Dir(filepath.Dir(java)),
		"/etc":                           "/etc",
		"/usr/bin/java":                  "/usr/bin/java",
	}
	found := false
	for _, d := range []string{"/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu"} {
		if _, err := os.Stat(filepath.Join(d, "libc.so.6")); err == nil {
			env[d] = "/lib/" + filepath.Base(d)
			found = true
		}
	}
	if !found {
		fstest.Lacks(t, "no multiarch libc directory (/usr/lib/<triplet>-linux-gnu) to build the java task's chroot from")
	}
	for _, d := range []string{"/usr/lib64", "/lib64"} {
		if fi, err := os.Lstat(d); err == nil && fi.IsDir() {
			env[d] = "/lib64"
			break
		}
	}
	return env
}

// TestJava: a jar built by the test, fetched as an artifact from a local
// server, runs with the java driver in its chroot, writes into its local/
// and prints a line.
func TestJava(t *testing.T) {
	requireAgentTests(t)
	jar := buildJar(t)
	srv := serveFiles(t, map[string][]byte{"hello.jar": jar})
	n := startNode(t, nodeOpts{chrootEnv: javaChrootEnv(t), drivers: []string{"java"}})
	start := time.Now()
	job := n.runJob(t, batchJob("java", fmt.Sprintf(`
      driver = "java"
      config {
        jar_path = "local/hello.jar"
      }
      artifact {
        source = "%s/hello.jar"
      }`, srv)))
	a := n.waitAlloc(t, job, nil, "complete")
	n.stderrOnFailure(t, a.ID, "t")
	t.Logf("the java task ran and completed %v after its job was registered", time.Since(start).Round(time.Millisecond))
	n.logs(t, a.ID, "t", "stdout", "java-stdout t\n")
	n.wantFile(t, a.ID+"/t/local/java.txt", "java-local\n")
	if got, err := n.readFile(t, a.ID+"/t/local/hello.jar"); err != nil || got != string(jar) {
		t.Errorf("the artifact on alloc_dir: %d bytes, %v; want the jar's %d", len(got), err, len(jar))
	}
}
