#!/usr/bin/env bash
# The project's side-by-side benchmark: gombus against nats-server and a
# plain Node socket.io relay, with the same client work (bench/, the
# `loadgen` crate). Builds loadgen, installs the relay's socket.io with
# `npm ci`, records the machine, then runs `loadgen suite`, which starts
# each peer fresh on free loopback ports and stops it by PID.
#
#   GOMBUS_BIN=bin/broker scripts/bench.sh
#   RUNS=1 WORKLOADS="fanout reqrep" PEERS="gombus nats" scripts/bench.sh
#
# Everything it writes goes under $GOMBUS_BENCH_DIR (default
# $TMPDIR/gombus-bench-own): target/ (the build), relay/ (the relay and its
# node_modules), results/<time>/ (results.jsonl, table.md, env.txt, the
# peers' logs). Knobs: docs/PERFORMANCE.md. A missing nats-server or Node
# skips that peer with a line saying so.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=${GOMBUS_BENCH_DIR:-${TMPDIR:-/tmp}/gombus-bench-own}
mkdir -p "$work"
export GOMBUS_BIN=${GOMBUS_BIN:-$repo/bin/broker}
case $GOMBUS_BIN in /*) ;; *) GOMBUS_BIN=$PWD/$GOMBUS_BIN ;; esac

cargo build --release --locked --quiet --manifest-path "$repo/bench/Cargo.toml" --target-dir "$work/target"
loadgen=$work/target/release/loadgen

# The relay: copied out of the repository and installed from its lock file,
# again only when the lock file changed.
relay=$work/relay
export RELAY_DIR=$relay
if command -v "${NODE:-node}" >/dev/null && command -v npm >/dev/null; then
  mkdir -p "$relay"
  cp "$repo/bench/peers/relay.js" "$repo/bench/peers/package.json" "$relay/"
  if ! cmp -s "$repo/bench/peers/package-lock.json" "$relay/package-lock.json" ||
    [[ ! -d $relay/node_modules/socket.io ]]; then
    cp "$repo/bench/peers/package-lock.json" "$relay/"
    (cd "$relay" && npm ci --no-audit --no-fund --loglevel=error) ||
      echo "bench: npm ci failed; the sio-relay peer will be skipped"
  fi
fi

out=$work/results/$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$out"
export GOMBUS_BENCH_OUT=$out
{
  echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "cpus: $(nproc) x $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)"
  echo "kernel: $(uname -sr)"
  echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "gombus: $("$GOMBUS_BIN" -version 2>/dev/null || echo "$GOMBUS_BIN") ($(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo '?'))"
  echo "nats-server: $("${NATS_SERVER:-nats-server}" --version 2>/dev/null || echo 'not found')"
  echo "node: $("${NODE:-node}" --version 2>/dev/null || echo 'not found'), socket.io $(sed -n 's/.*"version": "\(.*\)".*/\1/p' "$relay/node_modules/socket.io/package.json" 2>/dev/null | head -1)"
  echo "settings: RUNS=${RUNS:-3} SIZE=${SIZE:-128} WORKLOADS=\"${WORKLOADS:-default}\" PEERS=\"${PEERS:-default}\" PIN=${PIN:-auto} GOMBUS_ARGS=\"${GOMBUS_ARGS:-}\""
} >"$out/env.txt"
cat "$out/env.txt"
echo
status=0
"$loadgen" suite || status=$?
{ echo; cat "$out/env.txt"; } >>"$out/table.md"
exit "$status"
