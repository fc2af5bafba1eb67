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
# The binaries land in target/TARGET/PROFILE/. `make build` builds the
# host's release binaries through it too, so that `make dist` finds them
# built with the same flags. Prints the targets built, one a line, on
# stdout; exits non-zero only when cargo fails.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
profile="${1:?usage: cross-build.sh PROFILE TARGET...}"
shift
[[ $# -gt 0 ]] || { echo "usage: cross-build.sh PROFILE TARGET..." >&2; exit 2; }

mapfile -t ready < <("${repo_root}/scripts/cross-deps.sh" "$@")
[[ ${#ready[@]} -gt 0 ]] || exit 0

# The compiler flags of each target: glibc linked in statically for all;
# for x86_64, whose linker is Rust's LLD, identical functions folded into
# one (56 KB of the broker; GNU ld, which links the ARM targets, has no
# such option), and the relocations of the static position-independent
# executable packed as RELR (`-z pack-relative-relocs`: a bitmap of the
# addresses to adjust instead of 24 bytes each, 66 KB of the broker;
# glibc applies them at start-up as before; it needs the static glibc of
# Debian 12, 2.36, or later). The ARM binaries are not
# position-independent and carry no such relocations. For every target,
# LLVM inlines calls up to a cost of 100 instead of the 225 of
# opt-level 2 (`-C llvm-args=-inline-threshold=100`; functions marked
# `#[inline]` keep their threshold of 325): with `opt-level = 2` in
# Cargo.toml, 310 KB of the x86_64 broker for 0.6 % more instructions
# per fan-out publish and 1.9 % per stream publish (docs/PERFORMANCE.md,
# "Binary size", "Under 3 MiB"). The
# flags are given per target (CARGO_TARGET_<TRIPLE>_RUSTFLAGS), which
# Cargo reads only when RUSTFLAGS is unset.
inline="-C llvm-args=-inline-threshold=100"
rustflags_of() {
    case "$1" in
    x86_64-unknown-linux-gnu) echo "-C target-feature=+crt-static -C link-arg=-Wl,--icf=all -C link-arg=-Wl,-z,pack-relative-relocs ${inline}" ;;
    *) echo "-C target-feature=+crt-static ${inline}" ;;
    esac
}

args=()
envs=()
for t in "${ready[@]}"; do
    args+=(--target "$t")
    envs+=("CARGO_TARGET_$(tr 'a-z-' 'A-Z_' <<<"$t")_RUSTFLAGS=$(rustflags_of "$t")")
done
cd "$repo_root"
env -u RUSTFLAGS -u CARGO_ENCODED_RUSTFLAGS "${envs[@]}" "${CARGO:-cargo}" build --locked \
    --profile "$profile" "${args[@]}" --bin broker --bin gombus >&2
printf '%s\n' "${ready[@]}"
