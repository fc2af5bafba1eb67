#!/usr/bin/env bash
# Runs a three-node gombus cluster on this machine, on loopback.
#
#   scripts/cluster.sh start    build bin/broker if missing, start n1..n3
#   scripts/cluster.sh status   each node's cluster.status (via bin/gombus)
#   scripts/cluster.sh stop     SIGTERM each node by its PID, SIGKILL after 10 s
#
# Ports (override with the environment):
#   n1: HTTP 127.0.0.1:8081 (GOMBUS_N1_HTTP), Raft 127.0.0.1:9081 (GOMBUS_N1_RAFT)
#   n2: HTTP 127.0.0.1:8082 (GOMBUS_N2_HTTP), Raft 127.0.0.1:9082 (GOMBUS_N2_RAFT)
#   n3: HTTP 127.0.0.1:8083 (GOMBUS_N3_HTTP), Raft 127.0.0.1:9083 (GOMBUS_N3_RAFT)
# Control token: GOMBUS_CONTROL_TOKEN (default devtoken).
# Data, logs and PIDs: ./data/cluster/nX/ (data and Raft log),
# ./data/cluster/nX.log, ./data/cluster/nX.pid (GOMBUS_CLUSTER_DIR moves them).
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${repo_root}"

broker="${GOMBUS_BROKER:-bin/broker}"
cli="${GOMBUS_CLI:-bin/gombus}"
dir="${GOMBUS_CLUSTER_DIR:-./data/cluster}"
token="${GOMBUS_CONTROL_TOKEN:-devtoken}"
nodes=(n1 n2 n3)
declare -A http=(
    [n1]="${GOMBUS_N1_HTTP:-127.0.0.1:8081}"
    [n2]="${GOMBUS_N2_HTTP:-127.0.0.1:8082}"
    [n3]="${GOMBUS_N3_HTTP:-127.0.0.1:8083}"
)
declare -A raft=(
    [n1]="${GOMBUS_N1_RAFT:-127.0.0.1:9081}"
    [n2]="${GOMBUS_N2_RAFT:-127.0.0.1:9082}"
    [n3]="${GOMBUS_N3_RAFT:-127.0.0.1:9083}"
)
# How long start waits for each node to listen, and stop for each to exit.
start_wait_s=15
stop_wait_s=10

die() {
    echo "cluster.sh: $*" >&2
    exit 1
}

# The PID in nX.pid if that process is alive, else nothing.
running_pid() {
    local pidfile="${dir}/$1.pid" pid
    [[ -f "${pidfile}" ]] || return 1
    pid="$(cat "${pidfile}")"
    [[ "${pid}" =~ ^[0-9]+$ ]] || return 1
    kill -0 "${pid}" 2>/dev/null || return 1
    echo "${pid}"
}

peers() {
    local n list=()
    for n in "${nodes[@]}"; do
        list+=("${n}=${raft[${n}]}")
    done
    (IFS=,; echo "${list[*]}")
}

# Every node's HTTP address as the launch lines write it:
# n1=http://127.0.0.1:8081/socket.io,... (each node skips its own entry).
urls() {
    local n list=()
    for n in "${nodes[@]}"; do
        list+=("${n}=http://${http[${n}]}/socket.io")
    done
    (IFS=,; echo "${list[*]}")
}

# Starts node $1 unless it runs already; returns 1 if it was running.
start_node() {
    local n="$1" pid log="${dir}/$1.log"
    if pid="$(running_pid "${n}")"; then
        echo "${n}: already running (pid ${pid})"
        return 1
    fi
    mkdir -p "${dir}/${n}"
    "${broker}" \
        -node-id="${n}" \
        -addr="${http[${n}]}" \
        -data="${dir}/${n}" \
        -raft-addr="${raft[${n}]}" \
        -raft-peers="$(peers)" \
        -cluster="$(urls)" \
        -bootstrap \
        -control-token="${token}" \
        </dev/null >>"${log}" 2>&1 &
    pid=$!
    echo "${pid}" >"${dir}/${n}.pid"
    echo "${n}: pid ${pid}, http ${http[${n}]}, raft ${raft[${n}]}, log ${log}"
}

# Waits until node $1 has logged `listening on` since offset $2 of its log.
await_listening() {
    local n="$1" from="$2" log="${dir}/$1.log" deadline=$((SECONDS + start_wait_s))
    while ((SECONDS < deadline)); do
        if tail -c +"$((from + 1))" "${log}" 2>/dev/null | grep -q "listening on "; then
            return 0
        fi
        running_pid "${n}" >/dev/null || die "${n} exited; see ${log}"
        sleep 0.1
    done
    die "${n} did not listen within ${start_wait_s} s; see ${log}"
}

# Whether node $1's /healthz answers 200 (it knows a leader), using
# bash's /dev/tcp so that no HTTP client is needed.
healthy() {
    local hostport="${http[$1]}" status=""
    exec 3<>"/dev/tcp/${hostport%:*}/${hostport##*:}" 2>/dev/null || return 1
    printf 'GET /healthz HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n' "${hostport}" >&3
    read -r -t 2 status <&3 || true
    exec 3<&- 3>&-
    [[ "${status}" == *" 200 "* ]]
}

# Waits (bounded) until every started node knows a leader.
await_leader() {
    local n deadline=$((SECONDS + start_wait_s))
    for n in "$@"; do
        until healthy "${n}"; do
            ((SECONDS < deadline)) || die "${n} knows no leader after ${start_wait_s} s; see ${dir}/${n}.log"
            sleep 0.1
        done
    done
}

cmd_start() {
    if [[ ! -x "${broker}" ]]; then
        echo "building ${broker}"
        make build
    fi
    mkdir -p "${dir}"
    local n
    declare -A offset
    for n in "${nodes[@]}"; do
        offset[${n}]="$(stat -c %s "${dir}/${n}.log" 2>/dev/null || echo 0)"
        start_node "${n}" || unset "offset[${n}]"
    done
    for n in "${!offset[@]}"; do
        await_listening "${n}" "${offset[${n}]}"
    done
    await_leader "${!offset[@]}"
    echo "started; \`scripts/cluster.sh status\` shows the leader, \`scripts/cluster.sh stop\` stops the nodes"
}

cmd_stop() {
    local n pid deadline
    for n in "${nodes[@]}"; do
        if ! pid="$(running_pid "${n}")"; then
            echo "${n}: not running"
            rm -f "${dir}/${n}.pid"
            continue
        fi
        kill -TERM "${pid}"
        deadline=$((SECONDS + stop_wait_s))
        while kill -0 "${pid}" 2>/dev/null && ((SECONDS < deadline)); do
            sleep 0.1
        done
        if kill -0 "${pid}" 2>/dev/null; then
            echo "${n}: still running ${stop_wait_s} s after SIGTERM; sending SIGKILL"
            kill -KILL "${pid}" 2>/dev/null || true
        fi
        rm -f "${dir}/${n}.pid"
        echo "${n}: stopped (pid ${pid})"
    done
}

cmd_status() {
    local n pid rc=0
    if [[ ! -x "${cli}" ]]; then
        echo "building ${cli}"
        make build
    fi
    for n in "${nodes[@]}"; do
        echo "== ${n} (http ${http[${n}]})"
        if ! pid="$(running_pid "${n}")"; then
            echo "not running"
            rc=1
            continue
        fi
        echo "pid:          ${pid}"
        "${cli}" cluster status --server "${http[${n}]}" --control-token "${token}" || rc=1
    done
    return "${rc}"
}

case "${1:-}" in
start) cmd_start ;;
stop) cmd_stop ;;
status) cmd_status ;;
*)
    echo "usage: scripts/cluster.sh start|stop|status" >&2
    exit 2
    ;;
esac
