#!/usr/bin/env bash
# Cluster figures on loopback: a throwaway three-node cluster of bin/broker
# (plus one standalone node for reference), measured three ways.
#
#   a. fan-out: `gombus bench fanout` with publisher and subscribers on
#      the standalone node, on one cluster node, and with the publisher on
#      n1 and the subscribers split over n2 and n3 (--sub-server); RUNS
#      runs each, interleaved; medians and the cross-node/single-node ratio.
#   b. subscribe commit latency: `gombus bench subscribe` (send of `sub` to
#      its ack, each unsubscribed before the next) on the leader, on each
#      follower and on the standalone node; SUB_RUNS runs each.
#   c. failover: FAILOVERS times, examples/cluster_failover.rs kills the
#      leader with kill -9 while a publisher on one survivor sends to a
#      subscriber on the other every INTERVAL, and times from the kill the
#      first delivery of a message published after it, a survivor naming a
#      new leader, and the first acked `sub`. The killed node is then
#      started again and the next run waits until every node has applied
#      everything the leader committed.
#   d. stream failover: FAILOVERS times, examples/stream_failover.rs
#      kills the leader of a stream with three replicas (the leader of its
#      Raft group) with kill -9 while a publisher on a survivor sends one
#      acked publish every STREAM_INTERVAL, and times from the kill the
#      first accepted ack of a publish sent after it, and a survivor naming
#      a new leader (stream.info's cluster.leader; /metrics'
#      gombus_stream_group_leader). The killed node is started again and
#      the next run waits until every node names the same group leader.
#
# Prints a summary table; raw JSON lines go to
# $BENCH_WORK/cluster/results-<time>.jsonl, the table to summary-<time>.txt,
# broker logs to logs-<time>/. Every process it starts is stopped by PID
# when it exits, however it exits.
#
#   scripts/cluster-bench.sh                 # everything (make bench-cluster)
#   PARTS="fanout subscribe" scripts/cluster-bench.sh
#
# Knobs (environment):
#   GOMBUS_BIN, GOMBUS_CLI  broker and CLI binaries     [bin/broker, bin/gombus]
#   BENCH_WORK      work directory; this script uses $BENCH_WORK/cluster
#                                                      [/tmp/gombus-bench]
#   PARTS           which of fanout subscribe failover stream-failover
#                                                          [all four]
#   RUNS            runs per fan-out variant                           [3]
#   SUB_RUNS        runs per subscribe variant                         [1]
#   FANOUT_MSGS, SIZE, SUBS   fan-out parameters         [200000, 128, 4]
#   SUBSCRIBES      subscribes per subscribe run                    [1000]
#   FAILOVERS       failover runs (each of c and d)                   [10]
#   INTERVAL        publish interval during failover                 [2ms]
#   STREAM_INTERVAL acked publish interval during stream failover    [5ms]
#   PORT_BASE       HTTP ports PORT_BASE+1..3, Raft +11..13, standalone +20
#                                                                   [7400]
#   RAFT_LOG        -raft-log of the cluster nodes               [durable]
#   LOADGEN         the benchmark's load generator (bench/; scripts/bench.sh
#                   builds it as $GOMBUS_BENCH_DIR/target/release/loadgen);
#                   when set, fan-out also runs it against the standalone
#                   node and n1 with LOADGEN_MSGS messages (publisher and
#                   subscribers on one node; it needs far less CPU than the
#                   gombus client, so it shows the brokers' limit)
#                                                        [unset, 500000]
#   QUIET_PCT, QUIET_WAIT   before each fan-out run and each other part,
#                   wait at most QUIET_WAIT s for the host to be under
#                   QUIET_PCT % busy                               [15, 30]
set -euo pipefail
cd "$(dirname "$0")/.."

broker=${GOMBUS_BIN:-bin/broker}
cli=${GOMBUS_CLI:-bin/gombus}
work=${BENCH_WORK:-/tmp/gombus-bench}/cluster
parts=${PARTS:-fanout subscribe failover stream-failover}
runs=${RUNS:-3}
sub_runs=${SUB_RUNS:-1}
fanout_msgs=${FANOUT_MSGS:-200000}
size=${SIZE:-128}
subs=${SUBS:-4}
subscribes=${SUBSCRIBES:-1000}
failovers=${FAILOVERS:-10}
interval=${INTERVAL:-2ms}
stream_interval=${STREAM_INTERVAL:-5ms}
base=${PORT_BASE:-7400}
raft_log=${RAFT_LOG:-durable}
loadgen=${LOADGEN:-}
loadgen_msgs=${LOADGEN_MSGS:-500000}
quiet_pct=${QUIET_PCT:-15}
quiet_wait=${QUIET_WAIT:-30}
token=cluster-bench-$$

for tool in jq curl; do
  command -v "$tool" >/dev/null || { echo "cluster-bench: needs $tool" >&2; exit 1; }
done
for b in "$broker" "$cli"; do
  [[ -x $b ]] || { echo "cluster-bench: $b is missing (make build)" >&2; exit 1; }
done
cargo build --release --quiet --example cluster_failover --example stream_failover
probe=target/release/examples/cluster_failover
stream_probe=target/release/examples/stream_failover

stamp=$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$work"
rm -rf "$work/data"
logs=$work/logs-$stamp
results=$work/results-$stamp.jsonl
summary=$work/summary-$stamp.txt
mkdir -p "$logs" "$work/data"
: >"$results"

nodes=(n1 n2 n3)
declare -A http raft pid
for i in 1 2 3; do
  http[n$i]=127.0.0.1:$((base + i))
  raft[n$i]=127.0.0.1:$((base + 10 + i))
done
solo=127.0.0.1:$((base + 20))
solo_pid=
peers="n1=${raft[n1]},n2=${raft[n2]},n3=${raft[n3]}"

# Every process this script started goes when it ends.
cleanup() {
  local p
  for p in "${pid[@]}" $solo_pid; do
    [[ -n $p ]] && kill "$p" 2>/dev/null || true
  done
  for p in "${pid[@]}" $solo_pid; do
    [[ -n $p ]] && wait "$p" 2>/dev/null || true
  done
}
trap cleanup EXIT

say() { printf '%s %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
fail() { say "cluster-bench: $*"; exit 1; }

port_taken() { (exec 3<>"/dev/tcp/${1%:*}/${1#*:}") 2>/dev/null; }
for a in "${http[@]}" "${raft[@]}" "$solo"; do
  port_taken "$a" && fail "$a is already in use (set PORT_BASE)"
done

# Busy share of all CPUs over a second, in percent.
host_busy() {
  local a b
  read -r -a a < <(head -1 /proc/stat)
  sleep 1
  read -r -a b < <(head -1 /proc/stat)
  local total=0 i
  for i in 1 2 3 4 5 6 7 8; do total=$((total + b[i] - a[i])); done
  local idle=$((b[4] - a[4] + b[5] - a[5]))
  ((total > 0)) || { echo 0; return; }
  echo $(((total - idle) * 100 / total))
}
await_quiet() {
  local deadline=$((SECONDS + quiet_wait)) busy
  while :; do
    busy=$(host_busy)
    ((busy <= quiet_pct)) && return 0
    if ((SECONDS >= deadline)); then
      say "host still ${busy}% busy after ${quiet_wait}s; measuring anyway"
      return 0
    fi
  done
}

start_node() {
  local n=$1 others=() m
  for m in "${nodes[@]}"; do [[ $m != "$n" ]] && others+=("${http[$m]}"); done
  local IFS=,
  "$broker" -node-id="$n" -addr="${http[$n]}" -data="$work/data/$n" \
    -raft-addr="${raft[$n]}" -raft-peers="$peers" -cluster="${others[*]}" \
    -raft-log="$raft_log" -bootstrap -control-token="$token" 2>>"$logs/$n.log" &
  pid[$n]=$!
}

status() {
  "$cli" -s "${http[$1]}" --control-token "$token" --timeout 1s --json cluster status 2>/dev/null
}

# Waits (at most $1 s) until every node names the same leader and has
# applied everything that leader has committed; prints the leader.
await_cluster() {
  local deadline=$((SECONDS + $1)) leader commit n s ok
  while ((SECONDS < deadline)); do
    ok=1
    leader=$(status n1 | jq -r '.leader // empty') || true
    [[ -z $leader ]] && leader=$(status n2 | jq -r '.leader // empty') || true
    if [[ -n $leader ]]; then
      commit=$(status "$leader" | jq -r '.commit_index // empty') || true
      [[ -n $commit ]] || ok=0
      for n in "${nodes[@]}"; do
        ((ok)) || break
        s=$(status "$n") || { ok=0; break; }
        [[ $(jq -r .leader <<<"$s") == "$leader" ]] || ok=0
        (($(jq -r .applied_index <<<"$s") >= commit)) || ok=0
        [[ $(curl -s -o /dev/null -w '%{http_code}' "http://${http[$n]}/healthz") == 200 ]] || ok=0
      done
      if ((ok)); then
        echo "$leader"
        return 0
      fi
    fi
    sleep 0.05
  done
  return 1
}

await_listen() {
  local i
  for i in $(seq 200); do
    port_taken "$1" && return 0
    sleep 0.05
  done
  return 1
}

record() { jq -c "$1" <<<"$2" >>"$results"; }

# Forward batches node $1 dropped so far (its peer link was down or full).
fwd_dropped() {
  curl -s "http://${http[$1]}/metrics" | awk '$1 == "gombus_cluster_forward_batches_dropped_total" { print $2 + 0 }'
}

# jq: the median of an array of numbers (nulls left out).
jq_median='def median: map(select(. != null)) | sort | if length == 0 then null
  elif length % 2 == 1 then .[length / 2 | floor]
  else (.[length / 2 - 1] + .[length / 2]) / 2 end;'

say "host before: $(uptime)"
echo "{\"part\":\"env\",\"uptime_before\":\"$(uptime)\",\"nproc\":$(nproc),\"broker\":\"$broker\",\"raft_log\":\"$raft_log\"}" >>"$results"

say "starting standalone $solo and cluster n1..n3 (logs in $logs)"
"$broker" -node-id=solo -addr="$solo" -data="$work/data/solo" 2>>"$logs/solo.log" &
solo_pid=$!
for n in "${nodes[@]}"; do start_node "$n"; done
await_listen "$solo" || fail "the standalone node did not start"
leader=$(await_cluster 30) || fail "the cluster elected no leader within 30 s"
say "leader: $leader"

has_part() { [[ " $parts " == *" $1 "* ]]; }

# CPU time (user + system, in clock ticks) the given processes have used.
cpu_ticks() {
  local p sum=0 f
  for p in "$@"; do
    read -r -a f < <(sed 's/.*) //' "/proc/$p/stat")
    sum=$((sum + f[11] + f[12]))
  done
  echo "$sum"
}
hz=$(getconf CLK_TCK)
# Busy clock ticks of the whole host (all CPUs, idle and iowait left out).
host_busy_ticks() { awk 'NR == 1 { t = 0; for (i = 2; i <= 9; i++) t += $i; print t - $5 - $6 }' /proc/stat; }
# CPU seconds of this script's finished children (the bench client among
# them), in REPLY; `times` must run in this shell, not in a subshell.
child_cpu_s() {
  times >"$work/.times"
  REPLY=$(awk 'NR == 2 { s = 0; for (i = 1; i <= 2; i++) { split($i, a, "m"); sub("s", "", a[2]); s += a[1] * 60 + a[2] } print s }' "$work/.times")
}

# a. Fan-out. Recorded with each run: the CPU the brokers used (the
# standalone node, or all three cluster nodes), the bench client's CPU,
# and what the rest of the host used meanwhile (other_cpu_pct, % of one
# core): the client shares the host's CPUs, so the throughput can be
# client-bound, and anything else running shows there.
fanout() {
  local variant=$1 pubs=$2 subsrv=$3 run=$4 out c0 c1 procs h0 h1 k0 k1 t0 t1
  local args=(-s "$pubs" bench fanout --msgs "$fanout_msgs" --size "$size" --subs "$subs" --json)
  [[ -n $subsrv ]] && args+=(--sub-server "$subsrv")
  if [[ $variant == single ]]; then procs=("$solo_pid"); else procs=("${pid[@]}"); fi
  await_quiet
  child_cpu_s
  k0=$REPLY
  c0=$(cpu_ticks "${procs[@]}")
  h0=$(host_busy_ticks)
  t0=$(date +%s%N)
  "$cli" "${args[@]}" >"$work/.out" || fail "fanout $variant failed"
  t1=$(date +%s%N)
  h1=$(host_busy_ticks)
  c1=$(cpu_ticks "${procs[@]}")
  child_cpu_s
  k1=$REPLY
  out=$(<"$work/.out")
  record "{part:\"fanout\", variant:\"$variant\", run:$run, pub_server:\"$pubs\", sub_server:\"$subsrv\", leader:\"$leader\",
    wall_s:(($t1 - $t0) / 1e9), broker_cpu_s:(($c1 - $c0) / $hz), client_cpu_s:($k1 - $k0),
    other_cpu_pct:((($h1 - $h0 - $c1 + $c0) / $hz - ($k1 - $k0)) * 100 / (($t1 - $t0) / 1e9) | round | if . <= 0 then 0 else . end)} + ." "$out"
}
if has_part fanout; then
  say "fan-out: $fanout_msgs msgs of $size B, $subs subscribers, $runs runs per variant"
  for run in $(seq "$runs"); do
    fanout single "$solo" "" "$run"
    fanout cluster-local "${http[n1]}" "${http[n1]}" "$run"
    fanout cross-node "${http[n1]}" "${http[n2]},${http[n3]}" "$run"
    if [[ -n $loadgen ]]; then
      for v in single cluster-local; do
        if [[ $v == single ]]; then a=$solo p=$solo_pid; else a=${http[n1]} p=${pid[n1]}; fi
        await_quiet
        out=$("$loadgen" run fanout --proto sio --addr "$a" --msgs "$loadgen_msgs" --size "$size" \
          --subs "$subs" --server-pid "$p") || say "loadgen fanout on $v reported a failure"
        record "{part:\"loadgen\", variant:\"$v\", run:$run, server:\"$a\"} + ." "$out"
      done
    fi
  done
fi

# b. Subscribe commit latency.
if has_part subscribe; then
  leader=$(await_cluster 30) || fail "no settled cluster before the subscribe runs"
  followers=()
  for n in "${nodes[@]}"; do [[ $n != "$leader" ]] && followers+=("$n"); done
  await_quiet
  say "subscribe: $subscribes subscribes per run on leader $leader, followers ${followers[*]} and the standalone node"
  for run in $(seq "$sub_runs"); do
    for where in leader follower follower2 single; do
      case $where in
        leader) addr=${http[$leader]} ;;
        follower) addr=${http[${followers[0]}]} ;;
        follower2) addr=${http[${followers[1]}]} ;;
        single) addr=$solo ;;
      esac
      out=$("$cli" -s "$addr" bench subscribe --msgs "$subscribes" --json) || fail "subscribe on $where failed"
      record "{part:\"subscribe\", variant:\"$where\", run:$run, server:\"$addr\", leader:\"$leader\"} + ." "$out"
    done
  done
fi

# c. Failover.
if has_part failover; then
  await_quiet
  say "failover: $failovers runs, a publish every $interval"
  for run in $(seq "$failovers"); do
    leader=$(await_cluster 60) || fail "the cluster did not settle before failover run $run"
    survivors=()
    for n in "${nodes[@]}"; do [[ $n != "$leader" ]] && survivors+=("$n"); done
    victim=${pid[$leader]}
    drops0=$(fwd_dropped "${survivors[0]}")
    out=$("$probe" --pub "${http[${survivors[0]}]}" --sub "${http[${survivors[1]}]}" \
      --leader "$leader" --kill-pid "$victim" --control-token "$token" --interval "$interval") ||
      say "failover run $run: the probe reported a failure: $out"
    drops=$(($(fwd_dropped "${survivors[0]}") - drops0))
    # bash still reports "Killed" here: the notice is the shell's own.
    wait "$victim" 2>/dev/null || true
    pid[$leader]=
    [[ -n $out ]] || fail "failover run $run: no result"
    restart_t0=$(date +%s%N)
    start_node "$leader"
    if ! await_cluster 60 >/dev/null; then
      record "{part:\"failover\", run:$run, rejoin_ms:null, pub_node_forward_batches_dropped:$drops} + ." "$out"
      fail "failover run $run: $leader did not catch up within 60 s after its restart"
    fi
    rejoin_ms=$((($(date +%s%N) - restart_t0) / 1000000))
    record "{part:\"failover\", run:$run, pub_node:\"${survivors[0]}\", sub_node:\"${survivors[1]}\", rejoin_ms:$rejoin_ms, pub_node_forward_batches_dropped:$drops} + ." "$out"
    say "failover run $run: $(jq -c '{old_leader, new_leader, deliver_ms, leader_ms, sub_ms, lost, max_gap_ms}' <<<"$out") rejoin ${rejoin_ms}ms"
  done
fi

# The leader of stream $1's group as node $2's /metrics names it (empty
# while it names none).
group_leader() {
  curl -s "http://${http[$2]}/metrics" |
    awk -v want="gombus_stream_group_leader{stream=\"$1\"}" '$1 == want && $2 > 0 { print "n" $2 }'
}
# Waits (at most $2 s) until every node names the same leader of stream
# $1's group.
await_group() {
  local deadline=$((SECONDS + $2)) l n ok
  while ((SECONDS < deadline)); do
    ok=1
    l=$(group_leader "$1" n1)
    [[ -n $l ]] || ok=0
    for n in "${nodes[@]}"; do
      ((ok)) || break
      [[ $(group_leader "$1" "$n") == "$l" ]] || ok=0
    done
    ((ok)) && return 0
    sleep 0.05
  done
  return 1
}

# d. Stream failover.
if has_part stream-failover; then
  await_quiet
  say "stream failover: $failovers runs, an acked publish every $stream_interval"
  for run in $(seq "$failovers"); do
    await_cluster 60 >/dev/null || fail "the cluster did not settle before stream failover run $run"
    if ((run > 1)); then
      await_group FAILOVER 60 || fail "the stream's group has no leader all nodes name before run $run"
    fi
    out=$("$stream_probe" --nodes "${http[n1]},${http[n2]},${http[n3]}" \
      --pids "${pid[n1]},${pid[n2]},${pid[n3]}" --stream FAILOVER --interval "$stream_interval") ||
      say "stream failover run $run: the probe reported a failure: $out"
    [[ -n $out ]] || fail "stream failover run $run: no result"
    old=$(jq -r .old_leader <<<"$out")
    # bash still reports "Killed" here: the notice is the shell's own.
    wait "${pid[$old]}" 2>/dev/null || true
    pid[$old]=
    restart_t0=$(date +%s%N)
    start_node "$old"
    rejoin_ms=null
    if await_cluster 60 >/dev/null && await_group FAILOVER 60; then
      rejoin_ms=$((($(date +%s%N) - restart_t0) / 1000000))
    fi
    record "{part:\"stream-failover\", run:$run, rejoin_ms:$rejoin_ms} + ." "$out"
    say "stream failover run $run: $(jq -c '{old_leader, new_leader, ack_ms, info_leader_ms, group_leader_ms, refused, timeouts}' <<<"$out") rejoin ${rejoin_ms}ms"
    [[ $rejoin_ms != null ]] || fail "stream failover run $run: $old did not rejoin within 60 s after its restart"
  done
fi

say "host after: $(uptime)"
echo "{\"part\":\"env\",\"uptime_after\":\"$(uptime)\"}" >>"$results"

# The summary, from the results file.
{
  echo "gombus cluster bench, $(date -u +%FT%TZ), $(nproc) CPUs, raft log $raft_log"
  jq -r 'select(.part == "env") | (.uptime_before // .uptime_after)' "$results"
  if has_part fanout; then
    echo
    echo "a. fan-out: $fanout_msgs msgs x $size B, 1 publisher, $subs subscribers; medians of the complete"
    echo "   runs (every subscriber got every message); lost: deliveries missing, all runs together"
    echo "   broker CPU: all brokers of the variant; client: the bench client; other: the rest of the host (% of a core)"
    printf '%-14s %8s %12s %12s %10s %10s %8s %12s %15s %11s %9s\n' variant complete 'deliveries/s' 'publish/s' 'p50 us' 'p99 us' lost 'broker CPU s' 'CPU us/delivery' 'client CPU' 'other %'
    jq -rs "$jq_median"'
      map(select(.part == "fanout")) | group_by(.variant) | map(
        (map(select(.rows[1].msgs == .msgs * .subs))) as $ok | {
        v: .[0].variant,
        n: "\($ok | length)/\(length)",
        d: ($ok | map(.rows[1].msgs_per_sec) | median),
        p: ($ok | map(.rows[0].msgs_per_sec) | median),
        p50: ($ok | map(.rows[1].latency_us.p50) | median),
        p99: ($ok | map(.rows[1].latency_us.p99) | median),
        lost: (map(.msgs * .subs - .rows[1].msgs) | add),
        cpu: ($ok | map(.broker_cpu_s) | median),
        per: ($ok | map(.broker_cpu_s * 1e6 / .rows[1].msgs) | median),
        cli: ($ok | map(.client_cpu_s) | median),
        oth: (map(.other_cpu_pct) | max)
      }) | sort_by({"single":0,"cluster-local":1,"cross-node":2}[.v])[]
      | def r2: if . == null then "-" else . * 100 | round / 100 end;
        def f: if . == null then "-" else floor end;
        "\(.v) \(.n) \(.d|f) \(.p|f) \(.p50 // "-") \(.p99 // "-") \(.lost) \(.cpu|r2) \(.per|r2) \(.cli|r2) \(.oth)"' "$results" |
      while read -r v n d p a b l c u k o; do printf '%-14s %8s %12s %12s %10s %10s %8s %12s %15s %11s %9s\n' "$v" "$n" "$d" "$p" "$a" "$b" "$l" "$c" "$u" "$k" "$o"; done
    echo "   (other %: the highest of the variant's runs; above ~30 the host was busy: run again)"
    jq -rs "$jq_median"'
      map(select(.part == "fanout" and .rows[1].msgs == .msgs * .subs)) | group_by(.variant)
      | map({key: .[0].variant, value: (map(.rows[1].msgs_per_sec) | median)}) | from_entries
      | def ratio(a; b): if a == null or b == null then "-" else (a / b * 100 | round) / 100 end;
        "cross-node / single-node deliveries: \(ratio(.["cross-node"]; .single))"
        + "   cluster-local / single-node: \(ratio(.["cluster-local"]; .single))"' "$results"
    if [[ -n $loadgen ]]; then
      echo "   loadgen, $loadgen_msgs msgs (publisher and subscribers on one node; server CPU: that node's, % of a core):"
      printf '   %-14s %5s %12s %12s %6s %11s %11s %9s\n' variant runs 'deliveries/s' 'publish/s' lost 'server CPU' 'loadgen CPU' 'other %'
      jq -rs "$jq_median"'
        map(select(.part == "loadgen")) | group_by(.variant) | map({
          v: .[0].variant, n: length,
          d: (map(.deliveries_per_s) | median), p: (map(.pub_per_s) | median),
          lost: (map(.lost) | add), s: (map(.server_cpu_pct) | median),
          l: (map(.loadgen_cpu_pct) | median), o: (map(.other_cpu_pct) | max)
        }) | sort_by({"single":0,"cluster-local":1}[.v])[]
        | "\(.v) \(.n) \(.d|floor) \(.p|floor) \(.lost) \(.s) \(.l) \(.o)"' "$results" |
        while read -r v n d p l s g o; do printf '   %-14s %5s %12s %12s %6s %11s %11s %9s\n' "$v" "$n" "$d" "$p" "$l" "$s" "$g" "$o"; done
    fi
  fi
  if has_part subscribe; then
    echo
    echo "b. subscribe commit latency: $subscribes subscribes per run (send -> ack), medians of $sub_runs runs"
    printf '%-10s %8s %10s %10s %10s %14s\n' where node 'p50 us' 'p99 us' 'max us' 'unsub p50 us'
    jq -rs "$jq_median"'
      map(select(.part == "subscribe")) | group_by(.variant) | map({
        v: .[0].variant, s: .[0].server,
        p50: (map(.rows[0].latency_us.p50) | median),
        p99: (map(.rows[0].latency_us.p99) | median),
        max: (map(.rows[0].latency_us.max) | median),
        u50: (map(.rows[1].latency_us.p50) | median)
      }) | sort_by({"leader":0,"follower":1,"follower2":2,"single":3}[.v])[]
      | "\(.v) \(.s) \(.p50) \(.p99) \(.max) \(.u50)"' "$results" |
      while read -r v s a b c d; do printf '%-10s %8s %10s %10s %10s %14s\n' "$v" "${s##*:}" "$a" "$b" "$c" "$d"; done
  fi
  if has_part failover; then
    echo
    echo "c. failover (kill -9 of the leader; publish every $interval between the two survivors)"
    echo "deliver: first delivery of a message published after the kill; leader: a survivor names"
    echo "a new leader; sub: first acked sub sent after the kill; first sub: the one sent at the kill;"
    echo "lost: after the first delivery; unseen/visible: publishes lost, and ms from the subscriber's"
    echo "sub ack to the first delivered publish, before the publisher's node knew the subscription"
    echo "fwd drops: forward batches the publisher's node dropped during the run (peer link down or full)"
    printf '%4s %4s %4s %8s %8s %8s %9s %5s %7s %7s %8s %9s %8s\n' run old new deliver leader sub 'first sub' lost 'gap ms' unseen visible 'fwd drops' rejoin
    jq -r 'select(.part == "failover")
      | "\(.run) \(.old_leader) \(.new_leader) \(.deliver_ms // "-") \(.leader_ms // "-") \(.sub_ms // "-") \(.first_sub_ms // "-") \(.lost) \(.max_gap_ms) \(.unseen_at_start) \(.visible_ms // "-") \(.pub_node_forward_batches_dropped) \(.rejoin_ms // "-")"' "$results" |
      while read -r r o n d l s f lost g u v x j; do
        fmt() { [[ $1 == - ]] && echo - || printf '%.1f' "$1"; }
        printf '%4s %4s %4s %8s %8s %8s %9s %5s %7s %7s %8s %9s %8s\n' "$r" "$o" "$n" "$(fmt "$d")" "$(fmt "$l")" "$(fmt "$s")" "$(fmt "$f")" "$lost" "$(fmt "$g")" "$u" "$(fmt "$v")" "$x" "$j"
      done
    jq -rs "$jq_median"'
      map(select(.part == "failover")) as $f
      | def stat(k): ($f | map(.[k]) | map(select(. != null))) as $v
          | "\(k): median \(($v | median // 0) * 10 | round / 10) max \(($v | max // 0) * 10 | round / 10) (\($v | length) of \($f | length) runs)";
      stat("deliver_ms"), stat("leader_ms"), stat("sub_ms"), stat("first_sub_ms"), stat("max_gap_ms"),
      stat("visible_ms"), stat("rejoin_ms"),
      "lost messages in all runs: \($f | map(.lost) | add)"' "$results"
  fi
  if has_part stream-failover; then
    echo
    echo "d. stream failover (kill -9 of the leader of a stream with three replicas; an acked publish"
    echo "every $stream_interval through a survivor). ack: the first accepted ack of a publish sent after the"
    echo "kill; info: a survivor's stream.info names another leader; group: its /metrics names another"
    echo "leader of the stream's group; refused: publishes answered with an error meanwhile, by code"
    printf '%4s %4s %4s %8s %8s %8s %7s %8s  %s\n' run old new ack info group 'timeouts' rejoin refused
    jq -r 'select(.part == "stream-failover")
      | "\(.run) \(.old_leader) \(.new_leader // "-") \(.ack_ms // "-") \(.info_leader_ms // "-") \(.group_leader_ms // "-") \(.timeouts) \(.rejoin_ms // "-") \(.refused | to_entries | map("\(.key)=\(.value)") | join(",") | if . == "" then "-" else . end)"' "$results" |
      while read -r r o n a i g t j x; do
        printf '%4s %4s %4s %8s %8s %8s %7s %8s  %s\n' "$r" "$o" "$n" "$a" "$i" "$g" "$t" "$j" "$x"
      done
    jq -rs "$jq_median"'
      map(select(.part == "stream-failover")) as $f
      | def stat(k): ($f | map(.[k]) | map(select(. != null))) as $v
          | "\(k): median \(($v | median // 0) * 10 | round / 10) max \(($v | max // 0) * 10 | round / 10) (\($v | length) of \($f | length) runs)";
      stat("ack_ms"), stat("info_leader_ms"), stat("group_leader_ms"), stat("rejoin_ms")' "$results"
  fi
  echo
  echo "broker warnings and errors (logs in $logs):"
  grep -h -E '^[^ ]+ (warn|error) ' "$logs"/*.log | sed -E 's/^[^ ]+ //; s/[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+:[0-9]+/ADDR/g' |
    sort | uniq -c | sort -rn | head -12 || true
  echo
  echo "raw results: $results"
} | tee "$summary"
