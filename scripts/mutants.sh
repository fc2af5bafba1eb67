#!/usr/bin/env bash
# Safety mutants: each tests/mutants/NAME.patch breaks one safety rule on
# purpose (its "# rule:" line) and names the test targets that must catch
# it ("# tests:": integration test targets by name, and `lib:FILTER` for
# the library's unit tests whose names contain FILTER). Each is applied in turn to a scratch copy of the tree
# (under ${TMPDIR:-/tmp}/gombus-mutants, kept between runs so that a
# mutant rebuilds only what it changed), built, and run against those
# targets. Prints a table: mutant, rule, caught by (target: first failing
# test), seconds. Exits non-zero if a mutant is not caught, a patch no
# longer applies, or a mutant does not build.
#
#   scripts/mutants.sh                      every mutant
#   MUTANTS=raft-figure8,raft-vote-term-only scripts/mutants.sh
#
# A mutant is caught when one of its targets fails; every target is run,
# and all that fail are listed. The tree copied is the working tree of the
# repository (its tracked files), so uncommitted changes are tested too.
set -uo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
dir="${TMPDIR:-/tmp}/gombus-mutants"
tree="$dir/tree"
export CARGO_TARGET_DIR="$dir/target"
mkdir -p "$tree" "$CARGO_TARGET_DIR"

all=()
for p in "$repo"/tests/mutants/*.patch; do
  all+=("$(basename "$p" .patch)")
done
if [[ -n "${MUTANTS:-}" ]]; then
  IFS=, read -r -a picked <<<"$MUTANTS"
  for m in "${picked[@]}"; do
    [[ -f "$repo/tests/mutants/$m.patch" ]] || {
      echo "no mutant $m (have: ${all[*]})" >&2
      exit 2
    }
  done
else
  picked=("${all[@]}")
fi

# The scratch tree holds the repository's files (tracked and untracked,
# not ignored), all with a new mtime so that cargo rebuilds from them;
# files a mutant changed are copied back the same way.
sync_tree() {
  find "$tree" -mindepth 1 -maxdepth 1 -exec rm -rf {} +
  (cd "$repo" && git ls-files -z --cached --others --exclude-standard |
    xargs -0 tar -cf - 2>/dev/null) | tar -xmf - -C "$tree"
}
restore() {
  local f
  for f in "$@"; do
    cp "$repo/$f" "$tree/$f"
  done
}

rows=()
status=0
sync_tree
cd "$tree" || exit 2
for m in "${picked[@]}"; do
  patch_file="$repo/tests/mutants/$m.patch"
  rule=$(sed -n 's/^# rule: //p' "$patch_file")
  read -r -a targets <<<"$(sed -n 's/^# tests: //p' "$patch_file")"
  files=$(sed -n 's|^+++ b/||p' "$patch_file")
  start=$(date +%s)
  echo "== $m: $rule" >&2
  log="$dir/$m.log"
  if ! patch -d "$tree" -p1 -s --no-backup-if-mismatch <"$patch_file" >"$log" 2>&1; then
    caught="PATCH DOES NOT APPLY"
    status=1
  else
    args=()
    for t in "${targets[@]}"; do
      case "$t" in
        lib:*) args+=(--lib) ;;
        *) args+=(--test "$t") ;;
      esac
    done
    if ! cargo test --locked --no-run "${args[@]}" >>"$log" 2>&1; then
      caught="DOES NOT BUILD"
      status=1
    else
      caught=""
      for t in "${targets[@]}"; do
        case "$t" in
          lib:*) run=(--lib "${t#lib:}") ;;
          *) run=(--test "$t") ;;
        esac
        tlog="$dir/$m.${t//[:\/]/_}.log"
        if ! cargo test --locked "${run[@]}" >"$tlog" 2>&1; then
          first=$(sed -n 's/^test \(.*\) \.\.\. FAILED$/\1/p' "$tlog" | head -n 1)
          caught+="${caught:+, }$t${first:+: $first}"
        fi
      done
      if [[ -z "$caught" ]]; then
        caught="NOT CAUGHT"
        status=1
      fi
    fi
  fi
  # shellcheck disable=SC2086
  restore $files
  secs=$(($(date +%s) - start))
  rows+=("$m|$rule|$caught|$secs")
  echo "   $caught (${secs}s; logs: $dir/$m*.log)" >&2
done

printf '\n| mutant | rule | caught by | s |\n|---|---|---|---|\n'
for r in "${rows[@]}"; do
  IFS='|' read -r m rule caught secs <<<"$r"
  printf '| %s | %s | %s | %s |\n' "$m" "$rule" "$caught" "$secs"
done
exit "$status"
