#!/usr/bin/env bash
# Runs the official Engine.IO v4 and Socket.IO v5 protocol suites
# (socketio/engine.io-protocol and socketio/socket.io-protocol, directory
# test-suite/) against the conformance fixture, examples/conformance.rs.
#
#   scripts/conformance.sh [WORK_DIR]
#
# The suites are unpacked and installed in WORK_DIR (default: a fresh
# directory under ${TMPDIR:-/tmp}), never inside the repository. Where they
# come from: ENGINEIO_PROTOCOL_GIT and SOCKETIO_PROTOCOL_GIT, each either a
# local (bare) git directory or a URL to clone; both are required. The suites hard-code http://localhost:3000, so that port
# must be free. Prints each suite's mocha report; exits non-zero if a suite
# fails.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
work_dir="${1:-$(mktemp -d "${TMPDIR:-/tmp}/gombus-conformance.XXXXXX")}"
engine_src="${ENGINEIO_PROTOCOL_GIT:-}"
socket_src="${SOCKETIO_PROTOCOL_GIT:-}"
if [[ -z "$engine_src" || -z "$socket_src" ]]; then
    echo "conformance: set ENGINEIO_PROTOCOL_GIT and SOCKETIO_PROTOCOL_GIT to clones (or URLs) of socketio/engine.io-protocol and socketio/socket.io-protocol" >&2
    exit 2
fi
fixture_addr="127.0.0.1:3000"
# How long the fixture may take to print its `listening on` line.
startup_wait_s=10

case "${work_dir}/" in
"${repo_root}/"*)
    echo "conformance: WORK_DIR must be outside the repository" >&2
    exit 2
    ;;
esac

die() {
    echo "conformance: $*" >&2
    exit 1
}

need() {
    command -v "$1" >/dev/null 2>&1 || die "'$1' is not installed"
}

need git
need npm
need cargo

# Unpacks test-suite/ of the repository at $1 into $2/test-suite.
unpack_suite() {
    local src="$1" dest="$2" git_dir
    if [[ -f "${dest}/test-suite/package.json" ]]; then
        return 0
    fi
    mkdir -p "${dest}"
    if [[ -d "${src}" ]]; then
        git_dir="${src}"
    else
        git_dir="${dest}/repo.git"
        rm -rf "${git_dir}"
        git clone --quiet --bare --depth 1 "${src}" "${git_dir}" ||
            die "cannot clone ${src}"
    fi
    git --git-dir="${git_dir}" archive HEAD test-suite | tar -x -C "${dest}" ||
        die "no test-suite/ in ${src}"
}

install_suite() {
    local dir="$1/test-suite"
    if [[ -d "${dir}/node_modules/mocha" ]]; then
        return 0
    fi
    (cd "${dir}" && npm ci --no-audit --no-fund --loglevel=error) ||
        die "npm ci in ${dir} failed"
}

fixture_pid=""
fixture_log="${work_dir}/fixture.log"
stop_fixture() {
    if [[ -n "${fixture_pid}" ]]; then
        kill "${fixture_pid}" 2>/dev/null || true
        wait "${fixture_pid}" 2>/dev/null || true
    fi
}
trap stop_fixture EXIT

start_fixture() {
    (cd "${repo_root}" && cargo build --quiet --release --example conformance) ||
        die "building the fixture failed"
    "${repo_root}/target/release/examples/conformance" "${fixture_addr}" \
        >"${fixture_log}" 2>&1 &
    fixture_pid=$!
    local waited=0
    until grep -q "listening on" "${fixture_log}"; do
        if ! kill -0 "${fixture_pid}" 2>/dev/null; then
            cat "${fixture_log}" >&2
            die "the fixture exited (is ${fixture_addr} in use?)"
        fi
        if ((waited >= startup_wait_s * 10)); then
            die "the fixture did not listen within ${startup_wait_s}s"
        fi
        sleep 0.1
        waited=$((waited + 1))
    done
}

unpack_suite "${engine_src}" "${work_dir}/engine.io-protocol"
unpack_suite "${socket_src}" "${work_dir}/socket.io-protocol"
install_suite "${work_dir}/engine.io-protocol"
install_suite "${work_dir}/socket.io-protocol"
start_fixture

status=0
for suite in engine.io-protocol socket.io-protocol; do
    echo "==== ${suite}"
    (cd "${work_dir}/${suite}/test-suite" && npx mocha test-suite.js) || status=1
done
exit "${status}"
