# allocfs build, test and benchmark entry points. Every target works on a
# fresh machine once .ci/run (or the README's setup line) has installed the
# packages it needs.

GO        ?= go
GOBIN     := $(shell $(GO) env GOPATH)/bin
STATICCHECK ?= $(GOBIN)/staticcheck
PKGS      := ./...
# A generous per-package bound: a hung mount must fail the run, not CI.
TEST_TIMEOUT ?= 10m
# The binary's revision, for `allocfs --version` where the build has no
# VCS stamp (-buildvcs=false, or a copy of the tree without .git).
REVISION  := $(shell git rev-parse --short=12 HEAD 2>/dev/null)
LDFLAGS   := -ldflags "-X main.revision=$(REVISION)"

.PHONY: all build test test-btrfs test-nomad lint darwin bench tools clean fuzz

all: lint build test

build:
	$(GO) build ./...

test:
	$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) $(PKGS)

# test-nomad runs the real Nomad agent (NOMAD_BIN, else
# ../shared/tools/nomad/nomad beside the checkout) with its client's
# alloc_dir on an allocfs mount, and real raw_exec, exec, java and docker
# jobs on it (integration/nomadagent). Its tests skip under `make test`,
# which they would slow by minutes. Needs root, /dev/fuse, docker.io,
# busybox-static and a JDK; ALLOCFS_NOMAD_BACKEND=plain runs them on a
# plain alloc_dir instead.
test-nomad:
	ALLOCFS_NOMAD_TESTS=1 $(GO) test -race -count=1 -timeout 20m ./integration/nomadagent/

# fuzz runs each fuzz test for FUZZTIME on top of its seed corpus (the
# f.Add calls): the parsers of what a peer node, the kernel or a torn disk
# hands allocfs. A finding is written to the package's testdata/fuzz, from
# where go test replays it on every run.
FUZZTIME ?= 10s
FUZZ_TARGETS := ./internal/mountinfo:FuzzParse ./fs/store:FuzzDecodeJournal ./allocdir/snapshot:FuzzExtract
fuzz:
	@for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; name=$${t##*:}; \
		echo "fuzz $$name ($$pkg, $(FUZZTIME))"; \
		$(GO) test -run '^$$' -fuzz "^$$name$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; \
	done

# test-btrfs runs the tree's tests (./fs/...) again with every store on a
# btrfs image with disk limits on: layers as subvolumes, inode numbers
# tagged by layer (scripts/test-btrfs.sh). BTRFS_PKGS=./fs/store/... runs
# some of them; BTRFS_TESTFLAGS=-v shows what each test's stores are on.
# Needs root, loop devices and btrfs-progs; .ci/run runs it after make test.
BTRFS_PKGS      ?= ./fs/...
BTRFS_TESTFLAGS ?=
test-btrfs:
	GO=$(GO) TEST_TIMEOUT=$(TEST_TIMEOUT) BTRFS_PKGS="$(BTRFS_PKGS)" BTRFS_TESTFLAGS="$(BTRFS_TESTFLAGS)" bash scripts/test-btrfs.sh

lint: tools darwin
	@out="$$(gofmt -l .)"; if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	$(STATICCHECK) $(PKGS)

# darwin checks that the client side (the CLI that talks to a node, the
# api client, the allocdir contract) builds for an operator's Mac: a
# Linux-only import there fails the lint.
CLIENT_PKGS := ./cmd/allocfs ./api/... ./allocdir
darwin:
	GOOS=darwin $(GO) vet $(CLIENT_PKGS)
	for p in $(CLIENT_PKGS); do GOOS=darwin $(GO) test -c -o /dev/null $$p || exit 1; done
	GOOS=darwin $(GO) build -o /dev/null ./cmd/allocfs

# bench compares the mount and its peers (go-fuse's loopback, kernel
# overlayfs, fuse-overlayfs, libfuse's passthrough_ll and, for metadata,
# two no-op FUSE servers: a raw one, the true floor, and one behind
# go-fuse's node bridge) with their native backing filesystem
# (fs/bench_test.go, fs/benchpeers_test.go, fs/benchfloor_test.go, and the
# real workloads on Go's source tree of fs/benchwork_test.go;
# docs/benchmarks.md): BENCH_ROUNDS rounds of every workload, one whole
# workload per op, round i running the sides rotated by i-1 places so that
# each takes its turn first, then the ratios against native and the
# mount's against each side (scripts/benchratio.sh). The mount takes requests over /dev/fuse, as
# allocfs serve does by default (ALLOCFS_BENCH_IOURING=1: io_uring).
# Every side runs on one fresh ext4 image (scripts/benchfs.sh says why);
# BENCH_DIR=DIR runs them in DIR instead. Needs root, /dev/fuse and loop
# devices; cold runs drop the page cache; the workload rows need tar, git
# and sqlite3 (skipped without them), the fuse-overlayfs side Debian's
# fuse-overlayfs and the passthrough_ll side libfuse3-dev, a C compiler
# and pkg-config (each side skipped, with the reason, without them).
BENCH        ?= .
BENCH_ROUNDS ?= 3
BENCH_OUT    ?= bin/bench.txt
BENCH_DIR    ?=
bench:
	@mkdir -p $(dir $(BENCH_OUT)) && rm -f $(BENCH_OUT)
	$(GO) test -c -o bin/fs.test ./fs
	$(if $(BENCH_DIR),ALLOCFS_BENCH_DIR=$(BENCH_DIR),bash scripts/benchfs.sh) sh -c '\
	for i in $$(seq $(BENCH_ROUNDS)); do \
		order=rotate-$$((i - 1)); \
		echo "== round $$i of $(BENCH_ROUNDS) ($$order)" | tee -a $(BENCH_OUT); \
		{ ALLOCFS_BENCH_ORDER=$$order ./bin/fs.test -test.run "^\$$" -test.bench "$(BENCH)" -test.benchtime 1x -test.count 1 -test.timeout 30m 2>&1 || echo "FAIL: round $$i"; } | tee -a $(BENCH_OUT); \
	done'
	@if grep -q '^FAIL' $(BENCH_OUT); then echo "a benchmark round failed: see $(BENCH_OUT)"; exit 1; fi
	@sh scripts/benchratio.sh $(BENCH_OUT)

# bench-copyup times the first write to a file a snapshot migration left in
# a lower layer (the copy-up) against later writes and a native file, on
# ext4 and on loop-mounted ext4, xfs (reflink=1) and btrfs images
# (scripts/bench-copyup.sh, docs/benchmarks.md "Copy-up cost"). Needs root,
# /dev/fuse, loop devices, python3 and the mkfs tools; drops the page cache.
COPYUP_ROUNDS ?= 3
COPYUP_OUT    ?= bin/copyup.txt
.PHONY: bench-copyup
bench-copyup:
	$(GO) build $(LDFLAGS) -o bin/allocfs ./cmd/allocfs
	COPYUP_ROUNDS=$(COPYUP_ROUNDS) COPYUP_OUT=$(COPYUP_OUT) ALLOCFS_BIN=$(CURDIR)/bin/allocfs sh scripts/bench-copyup.sh

# bench-quota writes 1 GiB (dd conv=fsync) on plain btrfs, into a
# subvolume that a limited qgroup counts, and through `allocfs serve
# --enable-quotas` into an allocation with a limit, 6 rounds in rotated
# order (scripts/bench-quota.sh, docs/benchmarks.md "Disk limits"). Needs
# root, /dev/fuse, loop devices, btrfs-progs and bc.
.PHONY: bench-quota
bench-quota:
	$(GO) build $(LDFLAGS) -o bin/allocfs ./cmd/allocfs
	ALLOCFS_BIN=$(CURDIR)/bin/allocfs bash scripts/bench-quota.sh

# bench-nomad-exec times the real Nomad agent (-dev, NOMAD_BIN or
# ../shared/tools/nomad/nomad) starting an exec-driver batch job (its
# chroot build of Nomad's default chroot_env) and collecting it (`nomad
# system gc` and the client's GC until the allocation's directory is gone)
# with client.alloc_dir on `allocfs serve --chroot-env` (its data dir on a
# fresh ext4 image), on a plain alloc_dir on that image (another filesystem
# than /usr: Nomad copies the chroot) and on a plain alloc_dir on /usr's own
# filesystem (Nomad hard-links it), NOMAD_BENCH_ROUNDS rounds in rotated
# order, the page cache dropped before each start; then the medians and the
# ratios of the mount to each (scripts/bench-nomad-exec.sh, docs/benchmarks.md
# "Nomad's exec driver on the mount"). BENCH_CHROOT_ENV=LIST runs a smaller
# chroot_env. Needs root, /dev/fuse, loop devices, e2fsprogs, curl, jq and
# python3; a default run takes 20 minutes or more.
NOMAD_BENCH_ROUNDS ?= 3
.PHONY: bench-nomad-exec
bench-nomad-exec:
	$(GO) build $(LDFLAGS) -o bin/allocfs ./cmd/allocfs
	BENCH_ROUNDS=$(NOMAD_BENCH_ROUNDS) ALLOCFS_BIN=$(CURDIR)/bin/allocfs bash scripts/bench-nomad-exec.sh

# test-prjquota-vm runs the project-quota tests in a VM whose kernel has
# project quotas (this machine's has none): Debian's kernel package under
# qemu with an xfs and an ext4 disk (scripts/test-prjquota-vm.sh). Needs
# root, qemu-system-x86, cpio, xfsprogs, e2fsprogs and Debian's archive;
# .ci/run runs it.
.PHONY: test-prjquota-vm
test-prjquota-vm:
	GO=$(GO) bash scripts/test-prjquota-vm.sh

# scale mounts a separate `allocfs serve`, creates SCALE_ALLOCS allocations
# of 3 tasks, then lists SCALE_DIRS x SCALE_FILES empty files with a cold
# and a warm find beside the same find on the backing directory, and
# prints the daemon's VmRSS and VmHWM after each step
# (scripts/scale.sh, docs/benchmarks.md "Scale"). Needs root, /dev/fuse and
# python3; drops the page cache.
.PHONY: scale
scale:
	$(GO) build $(LDFLAGS) -o bin/allocfs ./cmd/allocfs
	ALLOCFS_BIN=$(CURDIR)/bin/allocfs bash scripts/scale.sh

# chaos runs tasks' I/O on CHAOS_ALLOCS allocations of a default `allocfs
# serve` while the daemon is killed with SIGKILL and started again, or
# upgraded (a second serve takes the mount over), CHAOS_ROUNDS times
# (CHAOS_UPGRADES of them upgrades) every 3-6 s, and reports what the tasks
# noticed: writes acknowledged, lost and duplicated, every failed system
# call, and the writers' pause per event against their own gaps
# (integration/chaos, docs/benchmarks.md "Chaos"). It fails when a task
# noticed anything. The data dir is made in CHAOS_DIR (the host's disk);
# CHAOS_EXT4=1 puts it on a fresh ext4 image instead (scripts/benchfs.sh).
# CHAOS_FLAGS adds flags (bin/chaos -h). Needs root and /dev/fuse.
CHAOS_ALLOCS   ?= 16
CHAOS_ROUNDS   ?= 20
CHAOS_UPGRADES ?= 3
CHAOS_DIR      ?= /var/tmp
CHAOS_EXT4     ?=
CHAOS_FLAGS    ?=
.PHONY: chaos
chaos:
	$(GO) build $(LDFLAGS) -o bin/allocfs ./cmd/allocfs
	$(GO) build -o bin/chaos ./integration/chaos
	$(if $(CHAOS_EXT4),BENCH_IMG_SIZE=4G bash scripts/benchfs.sh,ALLOCFS_BENCH_DIR=$(CHAOS_DIR)) sh -c '\
	./bin/chaos --allocfs bin/allocfs --dir "$$ALLOCFS_BENCH_DIR" --allocs $(CHAOS_ALLOCS) --rounds $(CHAOS_ROUNDS) --upgrades $(CHAOS_UPGRADES) $(CHAOS_FLAGS)'

tools:
	@test -x $(STATICCHECK) || $(GO) install honnef.co/go/tools/cmd/staticcheck@v0.8.2

clean:
	$(GO) clean -testcache

# run mounts allocfs on a data dir inside the checkout; Ctrl-C unmounts.
RUN_DIR ?= $(CURDIR)/.allocfs
.PHONY: run
run:
	$(GO) build $(LDFLAGS) -o bin/allocfs ./cmd/allocfs
	mkdir -p $(RUN_DIR)
	./bin/allocfs serve --data-dir $(RUN_DIR) --mount $(RUN_DIR)/mnt --socket $(RUN_DIR)/allocfs.sock
