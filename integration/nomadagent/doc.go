// Package nomadagent runs the real Nomad agent with its client's
// alloc_dir on an allocfs mount, and real jobs on it: raw_exec, exec and
// java tasks in their chroots, docker containers, templates, artifacts, a
// sticky ephemeral disk migrated to a replacement, and the garbage
// collection that ends an allocation. It has no code outside its tests.
//
// # Why the real agent
//
// integration/nomadreplay replays what Nomad's client does to alloc_dir,
// written from reading about it: it can only be as right as that reading.
// Here the judge is the agent itself (Nomad v2.0.5, from
// <repo>/../shared/tools/nomad/nomad or $NOMAD_BIN): whatever its client,
// drivers, executor, logmon, template and artifact hooks do through the
// mount, the test sees whether the job ran and what it left.
//
// The agent is a test peer, never a dependency: Nomad is under the
// Business Source License, so nothing here imports its root module or
// copies its code. The tests start its binary, write its configuration
// and jobs as HCL, and talk to it over its HTTP API on 127.0.0.1 with
// net/http (and its CLI, for what an operator types).
//
// # What runs
//
// Each test starts its own node: `allocfs serve` (integration/harness)
// with the client's chroot_env as --chroot-env, and `nomad agent -dev`
// on free ports of 127.0.0.1 with data_dir, alloc_dir (the mount) and
// alloc_mounts_dir in the test's temporary directory. The test of a
// migration between nodes starts a cluster instead: a server agent alone
// and two client agents, each with a serve, a mount, a data_dir and ports
// of its own. The docker test
// starts a dockerd of its own (no iptables, no bridge, its own data
// root and socket) and imports an image made of the host's static
// busybox; nothing is pulled. The java test builds its jar with the
// JDK and serves it, like the artifacts, from an httptest server.
//
// Cleanup does not depend on the test passing: the jobs are purged and
// their allocations waited for, the agent and everything it started
// (executors, logmon, tasks outlive an agent on purpose) are killed by
// PID, every mount Nomad made below alloc_dir (secrets/ and private/
// tmpfs, binds, dev, proc) is detached deepest first, then serve is
// stopped and the directories removed.
//
// # The tests
//
//	TestRawExec               a file in local/, stdout through the logs API, `nomad alloc logs` and `alloc fs`
//	TestExec                  a chroot of a static busybox as /bin/sh: local/, alloc/, stdout
//	TestJava                  a jar built here, fetched as an artifact, run in its chroot
//	TestDocker                a container writing local/, alloc/data and alloc/ through Nomad's binds
//	TestTemplatesAndArtifact  templates into local/, secrets/ and ${NOMAD_ALLOC_DIR}; a tar.gz unpacked
//	TestStickyMigrate         a changed job's replacement takes the sticky disk over (serve: op=remap)
//	TestMigrateBetweenNodes   a drained node's allocation moves with its disk to another node's mount
//	TestStopAndGC             stop, `nomad system gc` and the client's GC leave no directory, mount or record
//	TestRestarts              `alloc logs -f` across `alloc restart`; the agent killed and started again
//	TestServeUpgradeAndKill   an exec task writing files and stdout while serve is upgraded, then killed -9 and started
//	TestManyFilesInAlloc      10,000 files in ${NOMAD_ALLOC_DIR}: listed, counted in alloc/'s usage, collected
//
// Each asserts what a plain alloc_dir gives: a failure on the mount is a
// difference between the mount and the disk Nomad was written for.
//
// # Running
//
// The tests take minutes and skip unless ALLOCFS_NOMAD_TESTS=1, which
// `make test-nomad` sets; with ALLOCFS_REQUIRE_FUSE=1 (CI) a missing
// agent, dockerd, busybox-static or JDK fails them instead of skipping.
// ALLOCFS_NOMAD_BACKEND=plain runs every test with alloc_dir on a plain
// directory instead of the mount, which shows that a test can pass where
// Nomad is at home:
//
//	make test-nomad
//	ALLOCFS_NOMAD_TESTS=1 ALLOCFS_NOMAD_BACKEND=plain go test -race -count=1 -v ./integration/nomadagent/
package nomadagent
