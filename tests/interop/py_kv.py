"""Key-value buckets as python-socketio 5.x sees them: the rows of the
bucket table of the wire contract (section 14) and the new stream limit
`max_msgs_per_subject` (section 5), with the client's default transports,
asserting the shape of each ack.

Usage: py_kv.py URL [...]    (further arguments are ignored)

Prints `PASS <name>` or `FAIL <name>: <detail>` per check and exits 1 if
any failed; tests/interop.rs lists the check names it expects.
"""

import sys
import threading

import py_common
from py_common import check, start_watchdog
from py_streams import Peer, equal, is_bytes, keys

ENTRY_KEYS = ("key", "revision", "time", "op")


def entry(e, key, revision, op, value=None, what="entry"):
    keys(e, ENTRY_KEYS + (("value",) if op == "put" else ()), what)
    equal((e["key"], e["revision"], e["op"]), (key, revision, op), what)
    if op == "put":
        if isinstance(value, bytes):
            is_bytes(e["value"], value, f"{what} value")
        else:
            equal(e["value"], value, f"{what} value")


def check_per_subject(p):
    p.ok("stream.create", {"name": "PYPS", "subjects": ["pyps.*"],
                           "max_msgs_per_subject": 2})
    for i in range(4):
        p.ok("pub", {"subject": "pyps.a", "data": i})
    p.ok("pub", {"subject": "pyps.b", "data": "b"})
    st = p.ok("stream.info", {"name": "PYPS"})["stream"]
    equal(st["config"]["max_msgs_per_subject"], 2, "config")
    equal((st["state"]["messages"], st["state"]["first_seq"]), (3, 3), "state")
    p.ok("stream.delete", {"name": "PYPS"})


def check_buckets(p):
    ack = keys(p.ok("kv.create", {"bucket": "cfg", "history": 3}), ("ok", "bucket"), "create")
    b = keys(ack["bucket"], ("config", "state"), "bucket")
    keys(b["config"], ("bucket", "history", "ttl_ms", "max_bytes", "max_value_size",
                       "replicas"), "config")
    equal((b["config"]["bucket"], b["config"]["history"]), ("cfg", 3), "config")
    equal(b["state"], {"values": 0, "bytes": 0, "revision": 0}, "empty state")
    p.ok("kv.create", {"bucket": "cfg", "history": 3})
    p.error("kv.create", {"bucket": "cfg", "history": 4}, "exists")
    p.error("kv.create", {"bucket": "cfg", "history": 65}, "bad_request")
    p.error("kv.create", {"bucket": "a.b"}, "bad_request")
    names = [x["config"]["bucket"] for x in p.ok("kv.list", {})["buckets"]]
    equal(names, ["cfg"], "kv.list")
    streams = [s["config"]["name"] for s in p.ok("stream.list", {})["streams"]]
    if "KV_cfg" not in streams:
        raise AssertionError(f"KV_cfg not in stream.list: {streams}")
    p.error("stream.purge", {"name": "KV_cfg"}, "bad_request")
    p.error("kv.info", {"bucket": "nope"}, "not_found")


def check_put_get(p):
    watcher = Peer(p.url)
    try:
        watcher.ok("sub", {"subject": "$KV.cfg.>", "sid": "live"})
        r1 = keys(p.ok("kv.put", {"bucket": "cfg", "key": "a.b", "value": {"x": 1}}),
                  ("ok", "revision"), "put")["revision"]
        equal(r1, 1, "first revision")
        equal(watcher.next_msg()["subject"], "$KV.cfg.a.b", "a sub sees the write")
        r2 = p.ok("kv.put", {"bucket": "cfg", "key": "a.b", "value": "two"})["revision"]
        e = keys(p.ok("kv.get", {"bucket": "cfg", "key": "a.b"}), ("ok", "entry"), "get")
        entry(e["entry"], "a.b", r2, "put", "two", "kv.get")
        e = p.ok("kv.get", {"bucket": "cfg", "key": "a.b", "revision": r1})["entry"]
        entry(e, "a.b", r1, "put", {"x": 1}, "kv.get of a revision")
        p.error("kv.get", {"bucket": "cfg", "key": "nope"}, "not_found")
        p.error("kv.get", {"bucket": "cfg", "key": "a..b"}, "bad_request")
        # A pub to the key's subject is a put.
        seq = p.ok("pub", {"subject": "$KV.cfg.c", "data": 3})["seq"]
        equal(p.ok("kv.get", {"bucket": "cfg", "key": "c"})["entry"]["revision"], seq, "pub")
        blob = bytes(range(256))
        rb = p.ok("kv.put", {"bucket": "cfg", "key": "bin", "value": blob})["revision"]
        entry(p.ok("kv.get", {"bucket": "cfg", "key": "bin"})["entry"], "bin", rb, "put", blob,
              "binary value")
        equal(p.ok("kv.keys", {"bucket": "cfg"})["keys"], ["a.b", "c", "bin"], "keys")
        equal(p.ok("kv.keys", {"bucket": "cfg", "filter": "a.*"})["keys"], ["a.b"], "filter")
    finally:
        watcher.close()


def check_cas_delete_purge(p):
    latest = p.ok("kv.get", {"bucket": "cfg", "key": "a.b"})["entry"]["revision"]
    ack = p.call("kv.put", {"bucket": "cfg", "key": "a.b", "value": 0, "revision": latest - 1})
    equal(ack["error"]["code"], "wrong_revision", "stale revision")
    equal(ack["error"]["revision"], latest, "error.revision")
    r = p.ok("kv.put", {"bucket": "cfg", "key": "a.b", "value": 3, "revision": latest})["revision"]
    ack = p.call("kv.put", {"bucket": "cfg", "key": "new", "value": 1, "revision": 5})
    equal((ack["error"]["code"], ack["error"]["revision"]), ("wrong_revision", 0), "new key")
    p.ok("kv.put", {"bucket": "cfg", "key": "new", "value": 1, "revision": 0})
    d = p.ok("kv.delete", {"bucket": "cfg", "key": "a.b", "revision": r})["revision"]
    p.error("kv.get", {"bucket": "cfg", "key": "a.b"}, "not_found")
    hist = keys(p.ok("kv.history", {"bucket": "cfg", "key": "a.b"}), ("ok", "entries"),
                "history")["entries"]
    equal([h["op"] for h in hist], ["put", "put", "delete"], "history ops (history 3)")
    entry(hist[2], "a.b", d, "delete", what="delete marker")
    # After a delete, 0 means "no value".
    p.ok("kv.put", {"bucket": "cfg", "key": "a.b", "value": 4, "revision": 0})
    pr = p.ok("kv.purge", {"bucket": "cfg", "key": "a.b"})["revision"]
    hist = p.ok("kv.history", {"bucket": "cfg", "key": "a.b"})["entries"]
    equal([(h["op"], h["revision"]) for h in hist], [("purge", pr)], "purge leaves its marker")
    if "a.b" in p.ok("kv.keys", {"bucket": "cfg"})["keys"]:
        raise AssertionError("a purged key is listed")
    state = p.ok("kv.info", {"bucket": "cfg"})["bucket"]["state"]
    equal((state["values"], state["revision"]), (3, pr), "state after purge")


def check_race(p):
    """Two writers with the same revision: exactly one wins."""
    p.ok("kv.put", {"bucket": "cfg", "key": "lock", "value": 0})
    rev = p.ok("kv.get", {"bucket": "cfg", "key": "lock"})["entry"]["revision"]
    others = [Peer(p.url) for _ in range(4)]
    results = []
    try:
        def go(peer):
            results.append(peer.call("kv.put", {"bucket": "cfg", "key": "lock",
                                                "value": 1, "revision": rev}))
        threads = [threading.Thread(target=go, args=(o,)) for o in others]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        wins = [r for r in results if r.get("ok")]
        equal(len(results), 4, "every writer answered")
        equal(len(wins), 1, f"one winner: {results}")
    finally:
        for o in others:
            o.close()


def check_watch(p):
    w = Peer(p.url)
    try:
        sid = keys(w.ok("kv.watch", {"bucket": "cfg"}), ("ok", "sid"), "watch")["sid"]
        first = []
        while True:
            m = w.next_msg()
            if m is None:
                raise AssertionError(f"no caught_up after {first}")
            if m.get("caught_up"):
                equal(m, {"sid": sid, "bucket": "cfg", "caught_up": True}, "caught_up")
                break
            first.append(m)
        want = sorted(k for k in p.ok("kv.keys", {"bucket": "cfg"})["keys"])
        got = sorted(m["key"] for m in first if m["op"] == "put")
        equal(got, want, "a watch starts with each key's latest value")
        revs = [m["revision"] for m in first]
        equal(revs, sorted(revs), "in revision order")
        n = 50
        for i in range(n):
            p.call("kv.put", {"bucket": "cfg", "key": f"w.{i % 5}", "value": i})
        got = [w.next_msg() for _ in range(n)]
        equal([m["value"] for m in got], list(range(n)), "every new write, in order")
        keys(got[0], ("sid", "bucket", "key", "value", "revision", "op", "time"), "watch msg")
        revs = [m["revision"] for m in got]
        equal(revs, list(range(revs[0], revs[0] + n)), "no gap, no repeat")
        equal(w.ok("unsub", {"sid": sid}), {"ok": True}, "unsub ends a watch")
        p.ok("kv.put", {"bucket": "cfg", "key": "w.0", "value": "after"})
        w.ok("ping", {})
        equal(w.next_msg(wait=0.3), None, "nothing after unsub")
    finally:
        w.close()


def check_delete_bucket(p):
    equal(p.ok("kv.delete_bucket", {"bucket": "cfg"}), {"ok": True}, "delete_bucket")
    p.error("kv.get", {"bucket": "cfg", "key": "c"}, "not_found")
    equal(p.ok("kv.list", {})["buckets"], [], "no buckets")


def main():
    if len(sys.argv) < 2:
        print("usage: py_kv.py URL [...]", file=sys.stderr)
        return 2
    url = sys.argv[1]
    start_watchdog()
    p = Peer(url)
    p.url = url
    check("per_subject", lambda: check_per_subject(p))
    check("buckets", lambda: check_buckets(p))
    check("put_get", lambda: check_put_get(p))
    check("cas_delete_purge", lambda: check_cas_delete_purge(p))
    check("race", lambda: check_race(p))
    check("watch", lambda: check_watch(p))
    check("delete_bucket", lambda: check_delete_bucket(p))
    p.close()
    return py_common.summary()


if __name__ == "__main__":
    sys.exit(main())
