#!/usr/bin/env bash
# Runs every cargo test target (unit, integration, interop, abuse,
# conformance, simulations) and the benchmark crate's tests, and ends with
# one summary line, "tests: N passed, N failed", added up over all test
# binaries. Arguments go to every `cargo test` (for example
# `--no-fail-fast`). Exits non-zero when a build or a test failed.
#
# Everything is built first, once. The test binaries then run in two
# lanes side by side, because they use the machine in two different ways:
#   - "in-process": the library's unit tests, the Raft and stream
#     simulations, the codec, fuzz and model tests. They keep the cores
#     busy and start no process.
#   - "processes": every other target. They start brokers and clients and
#     mostly wait on them (elections, timeouts, fsyncs).
# On a two-core host that takes about two minutes off a sequential run.
# A new test target runs in the "processes" lane unless it is named in
# IN_PROCESS below. Each lane's output is printed whole when it ends.
set -uo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"

# The targets of the in-process lane (tests/NAME.rs or tests/NAME/main.rs).
IN_PROCESS=(stream_sim raft_sim raft_cases raft_log raft_multi fuzz
    entry_encoding store_model module_rules event_args protocol_edges)

logs=$(mktemp -d "${TMPDIR:-/tmp}/gombus-tests.XXXXXX")
trap 'rm -rf "$logs"' EXIT

# Counts the "test result:" lines of the logs given.
count() {
    awk -v what="$1" '/^test result:/ {
        for (i = 1; i <= NF; i++) if ($i ~ "^" what) s += $(i - 1)
    } END { print s + 0 }' "${@:2}"
}

# `cargo test --all-targets` compiles examples as test harnesses; the
# multi-process Raft test runs the real `raft_node` example binary, so the
# examples are built as programs too. The benchmark's own crate (bench/)
# follows: its unit tests and a short run of every workload against gombus.
if ! { cargo build --locked --examples &&
    cargo test --locked --all-targets --no-run &&
    cargo test --locked --manifest-path bench/Cargo.toml --no-run; } 2>&1 | tee "$logs/build"; then
    echo
    echo "tests: 0 passed, 1 failed (the build failed)"
    exit 101
fi

in_process=(--lib --bins --examples)
processes=()
for f in tests/*.rs tests/*/main.rs; do
    [[ -e $f ]] || continue
    name=${f#tests/}
    name=${name%.rs}
    name=${name%/main}
    if [[ " ${IN_PROCESS[*]} " == *" $name "* ]]; then
        in_process+=(--test "$name")
    else
        processes+=(--test "$name")
    fi
done

extra=("$@")
run_in_process() {
    cargo test --locked "${in_process[@]}" "${extra[@]}"
}
run_processes() {
    cargo test --locked "${processes[@]}" "${extra[@]}" &&
        cargo test --locked --manifest-path bench/Cargo.toml "${extra[@]}"
}

# lane NAME: runs run_NAME into $logs/NAME and its exit status into
# $logs/NAME.rc, then prints the log (one lane at a time).
lane() {
    local started=$SECONDS
    "run_${1//-/_}" >"$logs/$1" 2>&1
    echo $? >"$logs/$1.rc"
    flock "$logs/print.lock" bash -c 'echo "==== lane $1: $2 s"; cat "$3"' \
        _ "$1" "$((SECONDS - started))" "$logs/$1"
}

lane in-process &
lane processes &
wait

status=0
for name in in-process processes; do
    rc=$(cat "$logs/$name.rc" 2>/dev/null || echo 1)
    [[ $rc -eq 0 ]] || status=$rc
done
passed=$(count passed "$logs/in-process" "$logs/processes")
failed=$(count failed "$logs/in-process" "$logs/processes")
if [[ $status -ne 0 && $failed -eq 0 ]]; then
    # A crashed test binary: count it as a failure.
    failed=1
fi
echo
echo "tests: $passed passed, $failed failed"
exit "$status"
