#!/usr/bin/env bash
# Runs every cargo test target (unit, integration, interop, abuse,
# conformance, simulations) and the benchmark crate's tests, and ends with
# one summary line, "tests: N passed, N failed", added up over all test
# binaries. Arguments go to every `cargo test` (for example
# `--no-fail-fast`). Exits non-zero when a build or a test failed.
#
# Everything is built first, once. The test binaries then run in two
# lanes side by side, since most process tests spend their time waiting
# on the brokers they start (elections, timeouts, fsyncs) while the
# in-process tests keep the cores busy:
#   - lane a: the library's and binaries' unit tests, the Raft and stream
#     simulations, the codec, fuzz and model tests (nothing they run is a
#     process), then two long process tests, the network-namespace
#     partition run and the membership changes, so that both lanes end at
#     about the same time;
#   - lane b: every other target, then the benchmark crate's tests.
# On the two-core CI host this takes about three minutes off running the
# targets one after another. A new test target runs in lane b unless it
# is named in LANE_A. Each lane's output is printed whole when it ends.
set -uo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"

# The test targets of lane a (tests/NAME.rs or tests/NAME/main.rs).
LANE_A=(stream_sim raft_sim raft_cases raft_log raft_multi fuzz
    entry_encoding store_model module_rules event_args protocol_edges
    partitions membership)

logs=$(mktemp -d "${TMPDIR:-/tmp}/gombus-tests.XXXXXX")
trap 'rm -rf "$logs"' EXIT

# count WORD LOG...: adds up the "N WORD" figures of the logs' result lines.
count() {
    awk -v what="$1" '/^test result:/ {
        for (i = 1; i <= NF; i++) if ($i ~ "^" what) s += $(i - 1)
    } END { print s + 0 }' "${@:2}"
}

# The examples are built as programs (the multi-process Raft test runs the
# real `raft_node` example binary); they hold no tests, so they are not
# built again as test harnesses. The benchmark's own crate (bench/)
# follows: its unit tests and a short run of every workload against gombus.
if ! { cargo build --locked --examples &&
    cargo test --locked --lib --bins --tests --no-run &&
    cargo test --locked --manifest-path bench/Cargo.toml --no-run; } 2>&1 | tee "$logs/build"; then
    echo
    echo "tests: 0 passed, 1 failed (the build failed)"
    exit 101
fi

lane_a=(--lib --bins)
lane_b=()
for f in tests/*.rs tests/*/main.rs; do
    [[ -e $f ]] || continue
    name=${f#tests/}
    name=${name%.rs}
    name=${name%/main}
    if [[ " ${LANE_A[*]} " == *" $name "* ]]; then
        lane_a+=(--test "$name")
    else
        lane_b+=(--test "$name")
    fi
done

extra=("$@")
run_a() {
    cargo test --locked "${lane_a[@]}" "${extra[@]}"
}
run_b() {
    cargo test --locked "${lane_b[@]}" "${extra[@]}" &&
        cargo test --locked --manifest-path bench/Cargo.toml "${extra[@]}"
}

# lane NAME: runs run_NAME into $logs/NAME and its exit status into
# $logs/NAME.rc, then prints the log (one lane at a time).
lane() {
    local started=$SECONDS
    "run_$1" >"$logs/$1" 2>&1
    echo $? >"$logs/$1.rc"
    flock "$logs/print.lock" bash -c 'echo "==== lane $1: $2 s"; cat "$3"' \
        _ "$1" "$((SECONDS - started))" "$logs/$1"
}

lane a &
lane b &
wait

status=0
for name in a b; do
    rc=$(cat "$logs/$name.rc" 2>/dev/null || echo 1)
    [[ $rc -eq 0 ]] || status=$rc
done
passed=$(count passed "$logs/a" "$logs/b")
failed=$(count failed "$logs/a" "$logs/b")
if [[ $status -ne 0 && $failed -eq 0 ]]; then
    # A crashed test binary: count it as a failure.
    failed=1
fi
echo
echo "tests: $passed passed, $failed failed"
exit "$status"
