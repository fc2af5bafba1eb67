#!/usr/bin/env bash
# `make dist`: one tarball per target, gombus-VERSION-ARCH-linux.tar.gz in
# DIST_OUT, each holding the static, stripped release binaries
# (bin/gombus-broker, bin/gombus), the systemd units set for BINDIR,
# SYSCONFDIR and DOCDIR, the environment file, README and docs, and a
# SHA256SUMS of them all. The binaries are packed without their unwind
# tables (scripts/strip-unwind.sh), as `make build` copies them.
#
#   DIST_OUT=DIR VERSION=V BINDIR=.. SYSCONFDIR=.. DOCDIR=.. scripts/dist.sh TARGET...
#
# The targets are built with scripts/cross-build.sh (one cargo invocation);
# one that cannot be built here is skipped, naming what it lacks. Every
# broker and CLI is held to the size budget of dist/size-budget. Exits
# non-zero when a build fails, a binary is over budget, or no target could
# be built; prints the tarballs made.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
: "${DIST_OUT:?}" "${VERSION:?}" "${BINDIR:?}" "${SYSCONFDIR:?}" "${DOCDIR:?}"
[[ $# -gt 0 ]] || { echo "dist: no target given" >&2; exit 2; }
cd "$repo_root"

mapfile -t built < <(scripts/cross-build.sh release "$@")
[[ ${#built[@]} -gt 0 ]] || { echo "dist: none of $* could be built here" >&2; exit 1; }

# The budget: the first line of dist/size-budget that is a number.
budget="$(grep -m1 -E '^[0-9]+$' dist/size-budget)"

for t in "${built[@]}"; do
    arch="${t%%-*}"
    name="gombus-${VERSION}-${arch}-linux"
    out="${DIST_OUT}/${name}"
    from="target/${t}/release"
    rm -rf "$out"
    mkdir -p "$out/bin" "$out/systemd" "$out/docs"
    scripts/strip-unwind.sh "$t" "${from}/broker" "$out/bin/gombus-broker"
    scripts/strip-unwind.sh "$t" "${from}/gombus" "$out/bin/gombus"
    for b in gombus-broker gombus; do
        size="$(stat -c %s "$out/bin/${b}")"
        if [[ $size -gt $budget ]]; then
            echo "dist: ${arch} ${b} is ${size} bytes, over the budget of ${budget} (dist/size-budget)" >&2
            rm -rf "$out"
            exit 1
        fi
        echo "dist: ${arch} ${b}: ${size} bytes" >&2
    done
    for u in gombus.service gombus@.service; do
        sed -e "s|@BINDIR@|${BINDIR}|g" -e "s|@SYSCONFDIR@|${SYSCONFDIR}|g" \
            -e "s|@DOCDIR@|${DOCDIR}|g" "dist/systemd/$u" >"$out/systemd/$u"
    done
    cp dist/systemd/gombus.env "$out/systemd/gombus.env"
    cp README.md "$out/"
    cp docs/*.md "$out/docs/"
    (cd "$out" && find . -type f ! -name SHA256SUMS | sed 's|^\./||' | LC_ALL=C sort |
        xargs sha256sum >SHA256SUMS)
    tar -C "$DIST_OUT" --sort=name --owner=0 --group=0 --numeric-owner \
        -czf "${out}.tar.gz" "$name"
    rm -rf "$out"
    echo "${out}.tar.gz"
done
