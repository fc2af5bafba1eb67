#!/usr/bin/env bash
# Builds the static `broker` and `gombus` binaries for several targets in one
# cargo invocation (cargo then shares the host's build scripts and proc
# macros and compiles the targets side by side):
#
#   scripts/cross-build.sh PROFILE TARGET...
#
# PROFILE is a cargo profile (`release` for `make dist`, `cross-test` for the
# emulated tests). scripts/cross-deps.sh installs what each target needs; a
# target it cannot make ready is skipped with a line naming what is missing.
# The binaries land in target/TARGET/PROFILE/. Prints the targets built, one
# a line, on stdout; exits non-zero only when cargo fails.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
profile="${1:?usage: cross-build.sh PROFILE TARGET...}"
shift
[[ $# -gt 0 ]] || { echo "usage: cross-build.sh PROFILE TARGET..." >&2; exit 2; }

mapfile -t ready < <("${repo_root}/scripts/cross-deps.sh" "$@")
[[ ${#ready[@]} -gt 0 ]] || exit 0

args=()
for t in "${ready[@]}"; do
    args+=(--target "$t")
done
cd "$repo_root"
RUSTFLAGS="-C target-feature=+crt-static" "${CARGO:-cargo}" build --locked \
    --profile "$profile" "${args[@]}" --bin broker --bin gombus >&2
printf '%s\n' "${ready[@]}"
