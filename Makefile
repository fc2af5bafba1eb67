# gombus: build, run and test. `make run` starts a single node on
# 127.0.0.1:8080 with ./data; `make test` runs every test, installing what
# the interop tests need first.

CARGO ?= cargo
TARGET := x86_64-unknown-linux-gnu
RUSTFLAGS_STATIC := -C target-feature=+crt-static
BIN := bin/broker
CLI := bin/gombus

.PHONY: all build run cluster test test-deps fmt fmt-check clippy bench bench-cluster conformance clean sim fuzz

all: build

build: $(BIN) $(CLI)

# A statically linked, stripped release binary.
$(BIN): Cargo.toml Cargo.lock $(shell find src -name '*.rs')
	RUSTFLAGS="$(RUSTFLAGS_STATIC)" $(CARGO) build --release --locked --target $(TARGET) --bin broker
	mkdir -p bin
	cp target/$(TARGET)/release/broker $(BIN)

# The dashboard page is compiled into the broker.
$(BIN): src/broker/dashboard/index.html

# The gombus CLI, static like the broker.
$(CLI): Cargo.toml Cargo.lock $(shell find src -name '*.rs')
	RUSTFLAGS="$(RUSTFLAGS_STATIC)" $(CARGO) build --release --locked --target $(TARGET) --bin gombus
	mkdir -p bin
	cp target/$(TARGET)/release/gombus $(CLI)

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

fmt-check:
	$(CARGO) fmt --check

clippy:
	$(CARGO) clippy --locked --all-targets -- -D warnings

# Every test: formatting, lints, then unit, integration (against the
# release binary in bin/), interop (real Socket.IO clients), abuse and
# conformance tests, ending with a "tests: N passed, N failed" line.
test: build test-deps fmt-check clippy
	GOMBUS_BIN=$(CURDIR)/$(BIN) scripts/run-tests.sh

# The Raft simulation over more seeds than `make test` runs (2000), in
# release: `make sim SEEDS=100000`. A failure prints the command that
# replays its seed.
SEEDS ?= 20000
sim:
	SIM_SEEDS=$(SEEDS) $(CARGO) test --release --locked --test raft_sim -- --nocapture

# Every fuzz target (tests/fuzz.rs and the client's decoders) for SECS
# seconds in all, optimised with overflow checks on, under a fresh seed
# (or FUZZ_SEED). A failure prints the input and the command that replays
# it; failing inputs are saved under tests/fuzz/regressions/.
SECS ?= 600
fuzz:
	SECS=$(SECS) scripts/fuzz.sh

# The conformance fixture for the official Engine.IO/Socket.IO suites.
conformance:
	$(CARGO) run --release --example conformance

# Side-by-side load test against nats-server and a Node socket.io relay
# (needs nats-server and Node.js): every workload, including stream
# (acknowledged publishes, 128 B, default -sync=always); then the stream
# workload again at 4 KiB, and at both sizes under -sync=100ms; then
# fetch + ack throughput of a pull consumer under -sync=always and 100ms.
# BENCH_STREAM_VARIANTS=0 skips the extra stream runs.
WORKLOADS ?= fanout queue reqrep stream conns
BENCH_STREAM_VARIANTS ?= 1
bench: build
	GOMBUS_BIN=$(CURDIR)/$(BIN) WORKLOADS="$(WORKLOADS)" ../shared/bench/run.sh
	if [ "$(BENCH_STREAM_VARIANTS)" = 1 ]; then \
	  GOMBUS_BIN=$(CURDIR)/$(BIN) WORKLOADS=stream SIZE=4096 ../shared/bench/run.sh && \
	  GOMBUS_BIN=$(CURDIR)/$(BIN) WORKLOADS=stream PEERS=gombus GOMBUS_ARGS=-sync=100ms ../shared/bench/run.sh && \
	  GOMBUS_BIN=$(CURDIR)/$(BIN) WORKLOADS=stream PEERS=gombus GOMBUS_ARGS=-sync=100ms SIZE=4096 ../shared/bench/run.sh; \
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
