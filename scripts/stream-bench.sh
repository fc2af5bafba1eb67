#!/usr/bin/env bash
# Fetch + ack throughput of a pull consumer (examples/stream_bench.rs)
# against bin/broker, once per sync policy. Each broker gets a fresh data
# directory and a free loopback port, and is stopped by its PID.
#
#   scripts/stream-bench.sh [MSGS] [BATCH] [SIZE]
#   SYNCS="always 100ms" GOMBUS_BIN=bin/broker (defaults)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${GOMBUS_BIN:-bin/broker}
syncs=${SYNCS:-always 100ms}
cargo build --release --quiet --example stream_bench
bench=target/release/examples/stream_bench
for sync in $syncs; do
  data=$(mktemp -d "${TMPDIR:-/tmp}/gombus-stream-bench.XXXXXX")
  log=$data/broker.log
  : >"$log"
  "$bin" -addr=127.0.0.1:0 -node-id=bench -data="$data/d" -sync="$sync" 2>"$log" &
  pid=$!
  addr=
  for _ in $(seq 100); do
    addr=$(sed -n 's/.*listening on \([0-9.:]*\).*/\1/p' "$log")
    [[ -n $addr ]] && break
    sleep 0.05
  done
  if [[ -z $addr ]]; then
    kill "$pid" 2>/dev/null || true
    echo "stream-bench: broker did not start; log:" >&2
    cat "$log" >&2
    exit 1
  fi
  printf 'sync=%s ' "$sync"
  status=0
  "$bench" "$addr" "$@" || status=$?
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  rm -rf "$data"
  [[ $status -eq 0 ]] || exit "$status"
done
