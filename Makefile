# allocfs build, test and benchmark entry points. Every target works on a
# fresh machine once .ci/run (or the README's setup line) has installed the
# packages it needs.

GO        ?= go
GOBIN     := $(shell $(GO) env GOPATH)/bin
STATICCHECK ?= $(GOBIN)/staticcheck
PKGS      := ./...
# A generous per-package bound: a hung mount must fail the run, not CI.
TEST_TIMEOUT ?= 10m

.PHONY: all build test lint bench tools clean

all: lint build test

build:
	$(GO) build ./...

test:
	$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) $(PKGS)

lint: tools
	@out="$$(gofmt -l .)"; if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	$(STATICCHECK) $(PKGS)

bench:
	$(GO) test -run '^$$' -bench . -benchmem -count=3 $(PKGS)

tools:
	@test -x $(STATICCHECK) || $(GO) install honnef.co/go/tools/cmd/staticcheck@v0.8.2

clean:
	$(GO) clean -testcache

# run mounts allocfs on a data dir inside the checkout; Ctrl-C unmounts.
RUN_DIR ?= $(CURDIR)/.allocfs
.PHONY: run
run:
	$(GO) build -o bin/allocfs ./cmd/allocfs
	mkdir -p $(RUN_DIR)
	./bin/allocfs serve --data-dir $(RUN_DIR) --mount $(RUN_DIR)/mnt --socket $(RUN_DIR)/allocfs.sock
