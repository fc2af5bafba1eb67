#!/usr/bin/env bash
# Copies a release binary without its unwind tables (.eh_frame and
# .eh_frame_hdr): the broker and the CLI are built with panic = "abort",
# so nothing unwinds, and the tables only served debuggers and the
# addresses of a RUST_BACKTRACE=full panic report (254 KB of the x86_64
# broker; docs/PERFORMANCE.md, "Binary size"). rustc's
# `-C force-unwind-tables=no` does not drop them: they come with std's and
# glibc's code.
#
#   scripts/strip-unwind.sh TARGET IN OUT
#
# x86_64 only; the ARM binaries are copied as they are: GNU ld, which links
# them, puts the tables inside the code segment, so removing them frees no
# bytes of the file (objcopy keeps the segments where they are).
set -euo pipefail

target="${1:?usage: strip-unwind.sh TARGET IN OUT}"
in="${2:?usage: strip-unwind.sh TARGET IN OUT}"
out="${3:?usage: strip-unwind.sh TARGET IN OUT}"

# Written beside OUT and moved into place, so OUT is never half written.
tmp="${out}.tmp.$$"
case "$target" in
x86_64-unknown-linux-gnu)
    objcopy --remove-section=.eh_frame --remove-section=.eh_frame_hdr "$in" "$tmp" ;;
*) cp "$in" "$tmp" ;;
esac
mv "$tmp" "$out"
