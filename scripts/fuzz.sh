#!/usr/bin/env bash
# Long fuzzing passes (`make fuzz SECS=600`): every fuzz target in turn,
# built with the `fuzz` profile (optimised, overflow checks on), the time
# budget split evenly, one fresh seed for the run (or FUZZ_SEED). A target
# that fails prints each failing input as hex with the command that
# replays it; failing inputs are saved under tests/fuzz/regressions/<target>/
# (replayed by every later run, `make test` included), also when the
# input aborted the process. Ends with one line per target and exits
# non-zero if any failed.
set -uo pipefail
cd "$(dirname "$0")/.."
secs=${SECS:-600}
seed=${FUZZ_SEED:-$(( $(date +%s%N) % 1000000000000 ))}
profile=fuzz

echo "fuzz: building (profile $profile)"
# Build once and run the test binaries themselves, so that edits made
# while a long run goes on do not rebuild it halfway.
build_log=$(mktemp "${TMPDIR:-/tmp}/gombus-fuzz-build.XXXXXX")
if ! cargo test --locked --profile "$profile" --test fuzz --lib --no-run >"$build_log" 2>&1; then
  cat "$build_log"
  rm -f "$build_log"
  exit 1
fi
fuzz_bin=$(sed -n 's/^ *Executable tests\/fuzz.rs (\(.*\))$/\1/p' "$build_log")
lib_bin=$(sed -n 's/^ *Executable unittests src\/lib.rs (\(.*\))$/\1/p' "$build_log")
rm -f "$build_log"
if [[ -z $fuzz_bin || -z $lib_bin ]]; then
  echo "fuzz: could not find the test binaries" >&2
  exit 1
fi

mapfile -t integration < <("$fuzz_bin" --list 2>/dev/null | sed -n 's/: test$//p')
mapfile -t unit < <("$lib_bin" --list 2>/dev/null |
  sed -n 's/^\(.*::fuzz::[a-z0-9_]*\): test$/\1/p')
total=$(( ${#integration[@]} + ${#unit[@]} ))
if [[ $total -eq 0 ]]; then
  echo "fuzz: no targets found" >&2
  exit 1
fi
per=$(awk -v s="$secs" -v n="$total" 'BEGIN { v = s / n; if (v < 1) v = 1; printf "%.1f", v }')
echo "fuzz: seed $seed, $total targets, ${per}s each"

summary=()
failed=0
run_one() { # kind name
  local kind=$1 name=$2 short=${2##*::} log status
  log=$(mktemp "${TMPDIR:-/tmp}/gombus-fuzz.XXXXXX")
  rm -f "target/fuzz-current/$short" "target/fuzz-current/$short.input"
  local bin=$fuzz_bin
  [[ $kind == unit ]] && bin=$lib_bin
  FUZZ_SEED=$seed FUZZ_SECS=$per FUZZ_ITERS=18446744073709551615 FUZZ_SAVE=1 \
    "$bin" --exact "$name" --nocapture >"$log" 2>&1
  status=$?
  grep -E '^(fuzz |replay:|saved as|  [0-9a-f]{6}:)' "$log"
  if [[ $status -ne 0 ]] && ! grep -q 'FAILED on' "$log"; then
    # The process died under an input (abort, stack overflow): the input
    # it was running is still on disk.
    tail -n 20 "$log"
    if [[ -f target/fuzz-current/$short ]]; then
      local i hash dir=tests/fuzz/regressions/$short
      i=$(tr -d " " <"target/fuzz-current/$short.input")
      hash=$(cksum <"target/fuzz-current/$short" | cut -d' ' -f1)
      mkdir -p "$dir"
      cp "target/fuzz-current/$short" "$dir/crash-$hash.bin"
      echo "fuzz $short: the process died on input $i; saved as $dir/crash-$hash.bin"
      if [[ $kind == unit ]]; then
        echo "replay: FUZZ_SEED=$seed FUZZ_ONE=$i cargo test --profile $profile --lib -- --exact $name --nocapture"
      else
        echo "replay: FUZZ_SEED=$seed FUZZ_ONE=$i cargo test --profile $profile --test fuzz -- --exact $name --nocapture"
      fi
    fi
  fi
  local inputs
  inputs=$(sed -n 's/^fuzz [a-z0-9_]*: seed [0-9]* | \([0-9]*\) inputs.*/\1/p' "$log" | tail -n 1)
  if [[ $status -eq 0 ]]; then
    summary+=("ok      $short: ${inputs:-?} inputs")
  else
    summary+=("FAILED  $short: ${inputs:-?} inputs")
    failed=$((failed + 1))
  fi
  rm -f "$log"
}

for t in "${integration[@]}"; do run_one integration "$t"; done
for t in "${unit[@]}"; do run_one unit "$t"; done

echo
echo "fuzz report: seed $seed, ${per}s per target"
printf '  %s\n' "${summary[@]}"
echo "fuzz: $((total - failed)) targets passed, $failed failed"
[[ $failed -eq 0 ]]
