#!/usr/bin/env bash
# Installs what building and running gombus for other architectures needs,
# for each target named (default: all three):
#   x86_64-unknown-linux-gnu       nothing beyond the host toolchain;
#   aarch64-unknown-linux-gnu      rustup's target, Debian's
#                                  gcc-aarch64-linux-gnu and libc6-dev-arm64-cross;
#   armv7-unknown-linux-gnueabihf  rustup's target, Debian's
#                                  gcc-arm-linux-gnueabihf and libc6-dev-armhf-cross;
# and, with --qemu, Debian's qemu-user, which runs the ARM binaries on this
# host (tests/emulated.rs).
#
#   scripts/cross-deps.sh [--qemu] [--check] [TARGET...]
#
# Prints one line per target that cannot be built, naming what is missing,
# then the targets that can be built on stdout, one a line. A target that
# cannot be installed is not an error: the caller skips it. --check installs
# nothing and only reports. Quiet otherwise; exits non-zero only on misuse.
set -uo pipefail

all_targets=(x86_64-unknown-linux-gnu aarch64-unknown-linux-gnu armv7-unknown-linux-gnueabihf)
qemu=0
check=0
targets=()
for a in "$@"; do
    case "$a" in
    --qemu) qemu=1 ;;
    --check) check=1 ;;
    -*) echo "cross-deps: unknown flag $a" >&2 && exit 2 ;;
    *) targets+=("$a") ;;
    esac
done
[[ ${#targets[@]} -gt 0 ]] || targets=("${all_targets[@]}")

say() { echo "cross-deps: $*" >&2; }

# The linker command and the Debian packages a target needs.
linker_of() {
    case "$1" in
    x86_64-unknown-linux-gnu) echo cc ;;
    aarch64-unknown-linux-gnu) echo aarch64-linux-gnu-gcc ;;
    armv7-unknown-linux-gnueabihf) echo arm-linux-gnueabihf-gcc ;;
    esac
}
packages_of() {
    case "$1" in
    aarch64-unknown-linux-gnu) echo gcc-aarch64-linux-gnu libc6-dev-arm64-cross ;;
    armv7-unknown-linux-gnueabihf) echo gcc-arm-linux-gnueabihf libc6-dev-armhf-cross ;;
    esac
}
# The static C library the linker needs for +crt-static.
libc_of() {
    case "$1" in
    aarch64-unknown-linux-gnu) echo /usr/aarch64-linux-gnu/lib/libc.a ;;
    armv7-unknown-linux-gnueabihf) echo /usr/arm-linux-gnueabihf/lib/libc.a ;;
    esac
}

apt_updated=0
# apt_get PACKAGE...: installs the packages; false if apt cannot.
apt_get() {
    [[ $check -eq 0 ]] || return 1
    command -v apt-get >/dev/null 2>&1 || return 1
    local log
    log="$(mktemp "${TMPDIR:-/tmp}/gombus-cross-deps.XXXXXX")"
    if DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@" >"$log" 2>&1; then
        rm -f "$log"
        return 0
    fi
    if [[ $apt_updated -eq 0 ]]; then
        apt_updated=1
        apt-get update >"$log" 2>&1
        if DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@" >"$log" 2>&1; then
            rm -f "$log"
            return 0
        fi
    fi
    say "apt-get install $* failed: $(tail -n 1 "$log")"
    rm -f "$log"
    return 1
}

have_rust_target() {
    rustup target list --installed 2>/dev/null | grep -qx "$1"
}

# ready TARGET: true once everything TARGET needs is installed.
ready() {
    local t="$1" linker libc
    linker="$(linker_of "$t")"
    libc="$(libc_of "$t")"
    [[ "$t" == x86_64-unknown-linux-gnu ]] && return 0
    have_rust_target "$t" && command -v "$linker" >/dev/null 2>&1 && [[ -f "$libc" ]]
}

# missing TARGET: what is still missing, in words.
missing() {
    local t="$1" out=()
    have_rust_target "$t" || out+=("the Rust target (rustup target add $t)")
    command -v "$(linker_of "$t")" >/dev/null 2>&1 || out+=("the linker $(linker_of "$t") (Debian's $(packages_of "$t" | cut -d' ' -f1))")
    [[ -f "$(libc_of "$t")" ]] || out+=("the static C library $(libc_of "$t") (Debian's $(packages_of "$t" | cut -d' ' -f2))")
    local IFS=';'
    echo "${out[*]}"
}

install_target() {
    local t="$1"
    [[ $check -eq 0 ]] || return 0
    if ! have_rust_target "$t"; then
        if command -v rustup >/dev/null 2>&1; then
            rustup target add "$t" >/dev/null 2>&1 || say "rustup target add $t failed"
        fi
    fi
    if ! command -v "$(linker_of "$t")" >/dev/null 2>&1 || [[ ! -f "$(libc_of "$t")" ]]; then
        # shellcheck disable=SC2046 # two package names
        apt_get $(packages_of "$t") || true
    fi
}

for t in "${targets[@]}"; do
    case "$t" in
    x86_64-unknown-linux-gnu | aarch64-unknown-linux-gnu | armv7-unknown-linux-gnueabihf) ;;
    *) echo "cross-deps: unknown target $t (known: ${all_targets[*]})" >&2 && exit 2 ;;
    esac
    ready "$t" || install_target "$t"
    if ready "$t"; then
        echo "$t"
    else
        say "skipping $t: missing $(missing "$t")"
    fi
done

if [[ $qemu -eq 1 ]] && ! { command -v qemu-aarch64 >/dev/null 2>&1 && command -v qemu-arm >/dev/null 2>&1; }; then
    apt_get qemu-user || true
    command -v qemu-aarch64 >/dev/null 2>&1 && command -v qemu-arm >/dev/null 2>&1 ||
        say "qemu-aarch64 and qemu-arm are missing (Debian's qemu-user): the emulated tests will skip"
fi
exit 0
