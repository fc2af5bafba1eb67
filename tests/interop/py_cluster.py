"""Cluster interop with the unmodified python-socketio 5.x client.

Usage: py_cluster.py URL_N2 URL_N3   (URLs like http://127.0.0.1:PORT)

Run by tests/cluster.rs against a three-node cluster, in step with it:
  1. connects to n2 (the client's default transports), subscribes to
     `interop.cluster.to_py` and prints `READY`;
  2. waits for a message with data `{"from": "rust", ...}` that the Rust
     side publishes on n1 (it republishes until this script reports), then
     prints `PASS to_python`;
  3. connects to n3 and publishes `{"from": "python", "via": "n3"}` on
     `interop.cluster.to_rust`, which a Rust subscriber on n1 receives;
     prints `PASS from_python`;
  4. creates a stream on n3 and, through n2, publishes into it and reads
     the message back: both requests are relayed to n3, and the answer
     comes back as n3 gave it (key order, an integer past 64 bits); prints
     `PASS relayed_stream_answer`;
  5. creates a stream with `replicas: 3` on n3 (after `replicas: 4` is
     refused as `bad_request`) and reads `stream.info` through n2 until
     its `cluster` field lists the placement: the node leading the
     stream's group as `leader`, the two others as replicas, each with
     `current` and `lag`; prints
     `PASS replicated_stream_info`.
Ends with the summary line of py_common; exits 1 if a check failed. Every
wait is bounded and a watchdog ends a run that hangs.
"""

import sys
import time

import py_common
from py_common import check, start_watchdog

SUBJECT_IN = "interop.cluster.to_py"
SUBJECT_OUT = "interop.cluster.to_rust"
# The Rust side republishes every 100 ms for up to 5 s.
RECEIVE_WAIT_S = 10.0


def expect_ok(ack, what):
    if not isinstance(ack, dict) or ack.get("ok") is not True:
        raise AssertionError(f"{what}: expected an ack with ok:true, got {ack!r}")
    return ack


def check_to_python(peer):
    ack = expect_ok(peer.call("sub", {"subject": SUBJECT_IN}), "sub on n2")
    sid = ack.get("sid")
    print("READY", flush=True)
    deadline = time.monotonic() + RECEIVE_WAIT_S
    while time.monotonic() < deadline:
        msg = peer.next_msg(wait=max(0.0, deadline - time.monotonic()))
        if msg is None:
            break
        data = msg.get("data") if isinstance(msg, dict) else None
        if isinstance(data, dict) and data.get("from") == "rust":
            if msg.get("subject") != SUBJECT_IN or msg.get("sid") != sid:
                raise AssertionError(f"unexpected delivery {msg!r} (sid {sid!r})")
            return
    raise AssertionError(f"no message from n1 within {RECEIVE_WAIT_S:.0f} s")


def check_from_python(url_n3):
    peer = py_common.Peer(url_n3)
    try:
        expect_ok(peer.call("pub", {"subject": SUBJECT_OUT,
                                    "data": {"from": "python", "via": "n3"}}),
                  "pub on n3")
    finally:
        peer.close()


def check_relayed_stream_answer(peer_n2, url_n3):
    owner = py_common.Peer(url_n3)
    try:
        expect_ok(owner.call("stream.create", {"name": "PYREL", "subjects": ["pyrel.>"]}),
                  "stream.create on n3")
    finally:
        owner.close()
    # n2 learns of the stream within the replication delay.
    deadline = time.monotonic() + RECEIVE_WAIT_S
    while peer_n2.call("stream.info", {"name": "PYREL"}).get("ok") is not True:
        if time.monotonic() > deadline:
            raise AssertionError("n2 never knew stream PYREL")
        time.sleep(0.01)
    data = {"z": 1, "a": 12345678901234567890123, "m": [3, 2]}
    ack = expect_ok(peer_n2.call("pub", {"subject": "pyrel.x", "data": data}), "pub on n2")
    if ack.get("stream") != "PYREL" or not isinstance(ack.get("seq"), int):
        raise AssertionError(f"the relayed publish was not stored: {ack!r}")
    got = expect_ok(peer_n2.call("stream.get", {"name": "PYREL", "seq": ack["seq"]}),
                    "stream.get on n2")["message"]["data"]
    if got != data or list(got) != ["z", "a", "m"]:
        raise AssertionError(f"relayed answer changed: {got!r}")


def check_replicated_stream_info(peer_n2, url_n3):
    owner = py_common.Peer(url_n3)
    try:
        config = {"name": "PYR3", "subjects": ["pyr3.>"]}
        refused = owner.call("stream.create", dict(config, replicas=4))
        code = refused.get("error", {}).get("code") if isinstance(refused, dict) else None
        if code != "bad_request":
            raise AssertionError(f"replicas 4 of 3 nodes: {refused!r}")
        expect_ok(owner.call("stream.create", dict(config, replicas=3)),
                  "stream.create with replicas 3 on n3")
    finally:
        owner.close()
    deadline = time.monotonic() + RECEIVE_WAIT_S
    while True:
        info = peer_n2.call("stream.info", {"name": "PYR3"})
        cluster = info.get("cluster") if isinstance(info, dict) else None
        if isinstance(cluster, dict) and len(cluster.get("replicas", [])) == 2:
            break
        if time.monotonic() > deadline:
            raise AssertionError(f"stream.info on n2 never showed the placement: {info!r}")
        time.sleep(0.01)
    leader = cluster.get("leader")
    if leader not in ("n1", "n2", "n3"):
        raise AssertionError(f"leader: {cluster!r}")
    nodes = sorted([r.get("node") for r in cluster["replicas"]] + [leader])
    if nodes != ["n1", "n2", "n3"]:
        raise AssertionError(f"replicas: {cluster!r}")
    for r in cluster["replicas"]:
        if not isinstance(r.get("current"), bool) or "lag" not in r:
            raise AssertionError(f"a replica without current and lag: {r!r}")


def main():
    if len(sys.argv) != 3:
        print("usage: py_cluster.py URL_N2 URL_N3", file=sys.stderr)
        return 2
    url_n2, url_n3 = sys.argv[1], sys.argv[2]
    start_watchdog()
    peer = py_common.Peer(url_n2)
    try:
        check("to_python", lambda: check_to_python(peer))
        check("from_python", lambda: check_from_python(url_n3))
        check("relayed_stream_answer", lambda: check_relayed_stream_answer(peer, url_n3))
        check("replicated_stream_info", lambda: check_replicated_stream_info(peer, url_n3))
    finally:
        peer.close()
    return py_common.summary()


if __name__ == "__main__":
    sys.exit(main())
