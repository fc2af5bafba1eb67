# gombus: build, run and test. `make run` starts a single node on
# 127.0.0.1:8080 with ./data; `make test` runs every test, installing what
# the interop tests need first.

CARGO ?= cargo
TARGET := x86_64-unknown-linux-gnu
RUSTFLAGS_STATIC := -C target-feature=+crt-static
BIN := bin/broker
CLI := bin/gombus

.PHONY: all build run cluster test test-deps test-build lint cross-test test-armv7 fmt fmt-check clippy bench bench-cluster conformance clean sim fuzz soak mutants

all: build

build: $(BIN) $(CLI)

# The statically linked, stripped release binaries, built by one cargo
# invocation so that the two binaries' link-time optimisation (one thread
# each) runs side by side, with the flags scripts/cross-build.sh gives the
# target, and copied without their unwind tables (scripts/strip-unwind.sh).
$(BIN) $(CLI) &: Cargo.toml Cargo.lock $(shell find src -name '*.rs') src/broker/dashboard/index.html scripts/cross-build.sh scripts/strip-unwind.sh
	scripts/cross-build.sh release $(TARGET) >/dev/null
	mkdir -p bin
	scripts/strip-unwind.sh $(TARGET) target/$(TARGET)/release/broker $(BIN)
	scripts/strip-unwind.sh $(TARGET) target/$(TARGET)/release/gombus $(CLI)

run: build
	mkdir -p data
	./$(BIN) -addr=127.0.0.1:8080 -data=./data

# Three local nodes n1..n3 (HTTP 127.0.0.1:8081-8083, Raft 9081-9083), data
# and logs under ./data/cluster/. `scripts/cluster.sh status` shows each
# node's view of the leader; `scripts/cluster.sh stop` stops them.
cluster: build
	scripts/cluster.sh start

test-deps:
	scripts/test-deps.sh

fmt:
	$(CARGO) fmt
	$(CARGO) fmt --manifest-path bench/Cargo.toml

fmt-check:
	$(CARGO) fmt --check
	$(CARGO) fmt --check --manifest-path bench/Cargo.toml

# Into a target directory of its own (target/clippy), so that it can run
# while the test binaries build: two cargo commands on one directory take
# turns.
clippy:
	CARGO_TARGET_DIR=$(CURDIR)/target/clippy $(CARGO) clippy --locked --all-targets -- -D warnings
	CARGO_TARGET_DIR=$(CURDIR)/target/clippy $(CARGO) clippy --locked --all-targets --manifest-path bench/Cargo.toml -- -D warnings

lint: fmt-check clippy

# The test binaries, the examples and the benchmark crate's tests, built
# once (scripts/run-tests.sh builds them too when they are not). The
# examples are built as programs (tests/raft_node.rs runs one); they hold
# no tests, so they are not built again as test harnesses.
test-build:
	$(CARGO) build --locked --examples
	$(CARGO) test --locked --lib --bins --tests --no-run
	$(CARGO) test --locked --manifest-path bench/Cargo.toml --no-run

# Every test: formatting, lints, then unit, integration (against the
# release binary in bin/), interop (real Socket.IO clients), abuse,
# conformance and emulated ARM tests, ending with a "tests: N passed, N
# failed" line. Once the test dependencies are in, everything is built
# side by side (-j3): the release binaries (whose link-time optimisation
# runs on one core), the test binaries, the ARM binaries of the emulated
# tests, then the lints. scripts/run-tests.sh then runs the tests in two
# lanes. On a fresh clone on the two-core CI host `make test` takes about
# 7 minutes (14.5 when everything ran one after another).
test: test-deps
	$(MAKE) --no-print-directory -j3 -Otarget build test-build cross-test lint
	GOMBUS_BIN=$(CURDIR)/$(BIN) scripts/run-tests.sh

# The aarch64 and armv7 binaries that tests/emulated.rs runs under
# qemu-user, built with the quicker `cross-test` profile (Cargo.toml) into
# target/TARGET/cross-test/. A target whose toolchain is missing is skipped
# with a line naming what is missing, and its tests say they skipped.
CROSS_TEST_TARGETS := aarch64-unknown-linux-gnu armv7-unknown-linux-gnueabihf
cross-test:
	scripts/cross-build.sh cross-test $(CROSS_TEST_TARGETS) >/dev/null

# The Raft simulations over more seeds than `make test` runs (2000 each),
# in release: `make sim SEEDS=100000`. raft_sim is the control group
# alone; stream_sim is replicated streams (the control group and stream
# groups multiplexed on each node, with the stream state machine and
# fsync modelled). A failure prints the command that replays its seed.
SEEDS ?= 20000
sim:
	SIM_SEEDS=$(SEEDS) $(CARGO) test --release --locked --test raft_sim --test stream_sim -- --nocapture

# Every fuzz target (tests/fuzz.rs and the client's decoders) for SECS
# seconds in all, optimised with overflow checks on, under a fresh seed
# (or FUZZ_SEED). A failure prints the input and the command that replays
# it; failing inputs are saved under tests/fuzz/regressions/.
SECS ?= 600
fuzz:
	SECS=$(SECS) scripts/fuzz.sh

# Chaos soak: a three-node loopback cluster under a mixed load while a
# seeded schedule kills, freezes and restarts one node at a time (see
# tests/soak/). `make soak DURATION=30m SEED=42`; the report (report.md,
# memory.svg) goes to data/soak/<time>/. A failure prints its seed and the
# command that replays it. `make test` runs it for 60 s. Then the network
# partition run (tests/partitions.rs, as root: nodes in network
# namespaces, an R3 stream, leader cuts, one-way drops, lossy and slow
# links, flapping links, a follower's replica files damaged while it is
# down, a node added and removed during a cut) for PARTITION_DURATION
# (default DURATION) with the same SEED; it skips, saying why, where
# namespaces cannot be made.
DURATION ?= 30m
PARTITION_DURATION ?= $(DURATION)
SEED ?=
soak: build
	GOMBUS_BIN=$(CURDIR)/$(BIN) SOAK_DURATION=$(DURATION) SOAK_SEED=$(SEED) \
	  SOAK_REPORT_DIR=$(CURDIR)/data/soak/$$(date -u +%Y%m%dT%H%M%SZ) \
	  $(CARGO) test --locked --test soak chaos_soak -- --nocapture
	GOMBUS_BIN=$(CURDIR)/$(BIN) PARTITION_DURATION=$(PARTITION_DURATION) PARTITION_SEED=$(SEED) \
	  $(CARGO) test --locked --test partitions -- --nocapture

# The library's unit tests built for armv7 (32-bit) and run under
# qemu-arm, as a 32-bit host runs them: about a minute to build and a
# minute to run, so not part of `make test`. Run it after touching sizes,
# offsets or counters.
test-armv7:
	scripts/cross-deps.sh --qemu armv7-unknown-linux-gnueabihf | grep -q . || exit 1
	CARGO_TARGET_ARMV7_UNKNOWN_LINUX_GNUEABIHF_RUNNER=qemu-arm RUSTFLAGS="$(RUSTFLAGS_STATIC)" \
	  $(CARGO) test --locked --lib --target armv7-unknown-linux-gnueabihf

# Safety mutants (scripts/mutants.sh): each patch under tests/mutants/
# breaks one safety rule; the tests it names must catch it. Rebuilds for
# each mutant, so not part of `make test`: run it after touching a safety
# rule. `make mutants MUTANTS=raft-figure8,...` picks some; prints a
# table of mutant, rule, catching test and seconds.
MUTANTS ?=
mutants:
	MUTANTS=$(MUTANTS) scripts/mutants.sh

# The conformance fixture for the official Engine.IO/Socket.IO suites.
conformance:
	$(CARGO) run --release --example conformance

# The project's side-by-side benchmark (scripts/bench.sh, bench/): gombus
# against nats-server and a plain Node socket.io relay, same client work,
# workloads fanout, queue, reqrep, stream, kv (acked puts, then gets, to a
# key-value bucket; nats: JetStream's KV layout), conns, fanout3 (a three-node
# cluster) and stream3 (acked publishes to a stream with three replicas on
# a three-node cluster, publisher on a follower and on the leader); medians
# over RUNS (3) with server CPU per message, under $GOMBUS_BENCH_DIR (default /tmp/gombus-bench-own). A missing nats-server or
# Node skips that peer. Then, unless BENCH_STREAM_VARIANTS=0, the stream
# workload again at 4 KiB, and for gombus at both sizes under -sync=100ms;
# then fetch + ack throughput of a pull consumer (scripts/stream-bench.sh).
# Knobs (RUNS, PEERS, WORKLOADS, *_MSGS, SIZE, ...): docs/PERFORMANCE.md.
BENCH_STREAM_VARIANTS ?= 1
bench: build
	GOMBUS_BIN=$(CURDIR)/$(BIN) scripts/bench.sh
	if [ "$(BENCH_STREAM_VARIANTS)" = 1 ]; then \
	  GOMBUS_BIN=$(CURDIR)/$(BIN) WORKLOADS=stream SIZE=4096 scripts/bench.sh && \
	  GOMBUS_BIN=$(CURDIR)/$(BIN) WORKLOADS=stream PEERS=gombus GOMBUS_ARGS=-sync=100ms scripts/bench.sh && \
	  GOMBUS_BIN=$(CURDIR)/$(BIN) WORKLOADS=stream PEERS=gombus GOMBUS_ARGS=-sync=100ms SIZE=4096 scripts/bench.sh; \
	fi
	GOMBUS_BIN=$(CURDIR)/$(BIN) scripts/stream-bench.sh

# Cluster figures on a throwaway three-node loopback cluster (plus one
# standalone node): cross-node vs single-node fan-out, subscribe commit
# latency on the leader and the followers, and failover times after
# kill -9 of the leader. Knobs and output: scripts/cluster-bench.sh.
bench-cluster: build
	GOMBUS_BIN=$(CURDIR)/$(BIN) GOMBUS_CLI=$(CURDIR)/$(CLI) scripts/cluster-bench.sh

clean:
	$(CARGO) clean
	rm -rf bin

# Installing on a host. `make install` (PREFIX=/usr/local, DESTDIR to
# stage) puts the static binaries in $(BINDIR) as gombus-broker and
# gombus, the systemd units gombus.service and gombus@.service in
# $(UNITDIR), the environment file $(SYSCONFDIR)/gombus/gombus.env (mode
# 0600; an existing one is kept) and README and docs in $(DOCDIR).
# `make dist` packs the same files, units set for the default PREFIX, into
# $(DIST_OUT)/gombus-VERSION-ARCH-linux.tar.gz with a SHA256SUMS inside,
# for each of TARGETS (x86_64, aarch64 and armv7 by default; e.g.
# `make dist TARGETS=aarch64-unknown-linux-gnu`), built with the release
# profile (scripts/dist.sh). What the ARM targets need is installed by
# scripts/cross-deps.sh; a target that cannot be built here is skipped with
# a line naming what is missing. Every binary is held to the size budget in
# dist/size-budget.
PREFIX ?= /usr/local
BINDIR ?= $(PREFIX)/bin
SYSCONFDIR ?= /etc
UNITDIR ?= $(PREFIX)/lib/systemd/system
DOCDIR ?= $(PREFIX)/share/doc/gombus
INSTALL ?= install
VERSION := $(shell sed -n 's/^version = "\(.*\)"$$/\1/p' Cargo.toml | head -n 1)
DIST_OUT ?= $(CURDIR)
TARGETS ?= x86_64-unknown-linux-gnu aarch64-unknown-linux-gnu armv7-unknown-linux-gnueabihf
UNITS := gombus.service gombus@.service
DOCS := README.md $(wildcard docs/*.md)
# Fills in the paths the units and their comments name.
UNIT_PATHS = sed -e 's|@BINDIR@|$(BINDIR)|g' -e 's|@SYSCONFDIR@|$(SYSCONFDIR)|g' \
	-e 's|@DOCDIR@|$(DOCDIR)|g'

.PHONY: install dist

install: build
	$(INSTALL) -d -m 0755 $(DESTDIR)$(BINDIR) $(DESTDIR)$(UNITDIR) $(DESTDIR)$(DOCDIR)
	$(INSTALL) -d -m 0755 $(DESTDIR)$(SYSCONFDIR)/gombus
	$(INSTALL) -m 0755 $(BIN) $(DESTDIR)$(BINDIR)/gombus-broker
	$(INSTALL) -m 0755 $(CLI) $(DESTDIR)$(BINDIR)/gombus
	for u in $(UNITS); do \
	  $(UNIT_PATHS) dist/systemd/$$u > $(DESTDIR)$(UNITDIR)/$$u.new && \
	  chmod 0644 $(DESTDIR)$(UNITDIR)/$$u.new && \
	  mv $(DESTDIR)$(UNITDIR)/$$u.new $(DESTDIR)$(UNITDIR)/$$u || exit 1; \
	done
	[ -e $(DESTDIR)$(SYSCONFDIR)/gombus/gombus.env ] || \
	  $(INSTALL) -m 0600 dist/systemd/gombus.env $(DESTDIR)$(SYSCONFDIR)/gombus/gombus.env
	$(INSTALL) -m 0644 $(DOCS) $(DESTDIR)$(DOCDIR)/

dist: build
	@DIST_OUT=$(DIST_OUT) VERSION=$(VERSION) BINDIR=$(BINDIR) SYSCONFDIR=$(SYSCONFDIR) \
	  DOCDIR=$(DOCDIR) scripts/dist.sh $(TARGETS)
