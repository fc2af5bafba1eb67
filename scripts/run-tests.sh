#!/usr/bin/env bash
# Runs every cargo test target (unit, integration, interop, abuse,
# conformance) and ends with one summary line, "tests: N passed, N failed",
# added up over all test binaries. Exits with cargo's status.
set -uo pipefail
log=$(mktemp "${TMPDIR:-/tmp}/gombus-tests.XXXXXX")
trap 'rm -f "$log"' EXIT
# `cargo test --all-targets` compiles examples as test harnesses; the
# multi-process Raft test runs the real `raft_node` example binary, so
# build the examples as programs first. The benchmark's own crate (bench/)
# follows: its unit tests and a short run of every workload against gombus.
{ cargo build --locked --examples && cargo test --locked --all-targets "$@" &&
  cargo test --locked --manifest-path bench/Cargo.toml; } 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
passed=$(awk '/^test result:/ {for (i = 1; i <= NF; i++) if ($i ~ /^passed/) s += $(i - 1)} END {print s + 0}' "$log")
failed=$(awk '/^test result:/ {for (i = 1; i <= NF; i++) if ($i ~ /^failed/) s += $(i - 1)} END {print s + 0}' "$log")
if [[ $status -ne 0 && $failed -eq 0 ]]; then
  # A build error or a crashed test binary: count it as a failure.
  failed=1
fi
echo
echo "tests: $passed passed, $failed failed"
exit "$status"
