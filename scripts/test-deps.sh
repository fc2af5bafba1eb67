#!/usr/bin/env bash
# Installs what the interop tests (tests/interop.rs) need, and nothing else:
#   - .venv/ at the repository root with python-socketio 5.x and its
#     websocket transport (websocket-client), every package pinned;
#   - tests/interop/node/node_modules from the committed package-lock.json
#     (socket.io-client 4.x), installed with `npm ci`;
#   - tests/interop/node2/node_modules (socket.io-client 2.x) likewise;
#   - prometheus_client in the same .venv, whose strict text-format parser
#     checks /metrics (tests/metrics.rs);
#   - Debian's chromium (apt-get), the headless browser that loads the
#     dashboard (tests/dashboard.rs);
#   - Debian's nftables (apt-get), which drops packets on the links of the
#     network-namespace cluster (tests/partitions.rs);
#   - the aarch64 and armv7 toolchains (rustup targets, Debian's cross
#     linkers and C libraries) and Debian's qemu-user, which build and run
#     the ARM binaries of tests/emulated.rs (scripts/cross-deps.sh). What
#     cannot be installed there is named, and those tests skip.
# Idempotent: a stamp file records what was installed, and a second run that
# finds the same pins (and a working install) does nothing. Quiet on success;
# on failure the failing tool's output is shown and the exit code is non-zero.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv_dir="${repo_root}/.venv"
node_dir="${repo_root}/tests/interop/node"
log_file="$(mktemp "${TMPDIR:-/tmp}/gombus-test-deps.XXXXXX")"
trap 'rm -f "${log_file}"' EXIT

# Exact versions, checked to install together on CPython 3.11. The first two
# are what the tests use; the rest are their dependencies, pinned so a new
# release upstream cannot change what `make test` runs against.
python_pins=(
    "python-socketio[client]==5.18.1"
    "websocket-client==1.9.2"
    "python-engineio==4.15.1"
    "bidict==0.24.1"
    "simple-websocket==1.1.0"
    "wsproto==1.3.2"
    "h11==0.16.0"
    "requests==2.34.2"
    "urllib3==2.8.0"
    "idna==3.20"
    "charset-normalizer==3.5.3"
    "certifi==2026.10.19.post1"
    "prometheus-client==0.26.0"
)

die() {
    echo "test-deps: $*" >&2
    if [[ -s "${log_file}" ]]; then
        echo "---- output of the failing step ----" >&2
        cat "${log_file}" >&2
    fi
    exit 1
}

# Runs a command with its output kept aside, shown only if it fails.
quietly() {
    : >"${log_file}"
    "$@" >"${log_file}" 2>&1
}

need() {
    command -v "$1" >/dev/null 2>&1 || die "'$1' is not installed; $2"
}

# ---- Python ---------------------------------------------------------------

python_stamp="${venv_dir}/.gombus-test-deps"
python_want="$(printf '%s\n' "${python_pins[@]}")"

python_is_current() {
    [[ -x "${venv_dir}/bin/python" ]] || return 1
    [[ -f "${python_stamp}" ]] || return 1
    [[ "$(cat "${python_stamp}")" == "${python_want}" ]] || return 1
    # The stamp could outlive a broken venv (e.g. the base interpreter moved).
    "${venv_dir}/bin/python" -c 'import socketio, websocket, prometheus_client' >/dev/null 2>&1
}

make_venv() {
    need python3 "install Python 3 (3.8 or newer)"
    if quietly python3 -m venv "${venv_dir}"; then
        return 0
    fi
    # Debian splits the venv module (and ensurepip) into python3-venv.
    rm -rf "${venv_dir}"
    if command -v apt-get >/dev/null 2>&1; then
        quietly apt-get install -y python3-venv ||
            quietly sh -c 'apt-get update && apt-get install -y python3-venv' ||
            die "could not install python3-venv with apt-get"
        quietly python3 -m venv "${venv_dir}" || die "python3 -m venv failed"
    else
        die "python3 -m venv failed and apt-get is not available"
    fi
}

install_python() {
    if [[ -d "${venv_dir}" && ! -x "${venv_dir}/bin/python" ]]; then
        rm -rf "${venv_dir}"
    fi
    if [[ ! -x "${venv_dir}/bin/python" ]]; then
        make_venv
    fi
    rm -f "${python_stamp}"
    quietly "${venv_dir}/bin/python" -m pip install --disable-pip-version-check \
        --no-input --quiet "${python_pins[@]}" ||
        die "pip install into ${venv_dir} failed"
    quietly "${venv_dir}/bin/python" -c 'import socketio, websocket, prometheus_client' ||
        die "the venv cannot import socketio, websocket and prometheus_client after installing"
    printf '%s\n' "${python_want}" >"${python_stamp}"
}

# ---- Node -----------------------------------------------------------------

node_stamp="${node_dir}/node_modules/.gombus-test-deps"

node_is_current() {
    [[ -f "${node_stamp}" ]] || return 1
    # npm ci is keyed on the lock file: reinstall whenever it changed.
    cmp -s "${node_stamp}" "${node_dir}/package-lock.json" || return 1
    [[ -f "${node_dir}/node_modules/socket.io-client/package.json" ]]
}

install_node() {
    need node "install Node.js 18 or newer"
    need npm "install npm (it ships with Node.js)"
    [[ -f "${node_dir}/package-lock.json" ]] ||
        die "${node_dir}/package-lock.json is missing"
    quietly npm ci --prefix "${node_dir}" --no-audit --no-fund --loglevel=error ||
        die "npm ci in ${node_dir} failed"
    cp "${node_dir}/package-lock.json" "${node_stamp}"
}

# socket.io-client 2.x (Engine.IO v3) for the legacy-client checks.
node2_dir="${repo_root}/tests/interop/node2"
node2_stamp="${node2_dir}/node_modules/.gombus-test-deps"

node2_is_current() {
    [[ -f "${node2_stamp}" ]] || return 1
    cmp -s "${node2_stamp}" "${node2_dir}/package-lock.json" || return 1
    [[ -f "${node2_dir}/node_modules/socket.io-client/package.json" ]]
}

install_node2() {
    [[ -f "${node2_dir}/package-lock.json" ]] ||
        die "${node2_dir}/package-lock.json is missing"
    quietly npm ci --prefix "${node2_dir}" --no-audit --no-fund --loglevel=error ||
        die "npm ci in ${node2_dir} failed"
    cp "${node2_dir}/package-lock.json" "${node2_stamp}"
}

# ---- Debian packages (Chromium, nftables) ---------------------------------

# apt_install PACKAGE COMMAND: installs PACKAGE so that COMMAND is on PATH.
apt_install() {
    command -v apt-get >/dev/null 2>&1 ||
        die "$2 is not installed and apt-get is not available; install $1 so that '$2' is on PATH"
    quietly apt-get install -y --no-install-recommends "$1" ||
        quietly sh -c "apt-get update && apt-get install -y --no-install-recommends $1" ||
        die "could not install $1 with apt-get"
    command -v "$2" >/dev/null 2>&1 || die "$2 is still not on PATH after installing $1"
}

install_chromium() { apt_install chromium chromium; }
install_nftables() { apt_install nftables nft; }

python_is_current || install_python
node_is_current || install_node
node2_is_current || install_node2
command -v chromium >/dev/null 2>&1 || install_chromium
command -v nft >/dev/null 2>&1 || install_nftables
# Not fatal: the emulated tests skip, saying why, without them.
"${repo_root}/scripts/cross-deps.sh" --qemu aarch64-unknown-linux-gnu armv7-unknown-linux-gnueabihf >/dev/null
