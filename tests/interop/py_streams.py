"""Streams as python-socketio 5.x sees them: every row of the stream table
of the wire contract (section 5, and the stream parts of section 4), with
the client's default transports (long-polling first, then the upgrade to
WebSocket), asserting the exact shape of each ack.

Usage: py_streams.py URL [...]    (URL like http://127.0.0.1:PORT; further
arguments, which tests/interop.rs passes to every script, are ignored)

Prints one line per check, `PASS <name>` or `FAIL <name>: <detail>`, and
exits 1 if any check failed. Every wait is bounded; a watchdog ends the
process if the whole run outlasts RUN_MAX_S. tests/interop.rs runs it and
lists the check names it expects, so a rename here must be made there too.
"""

import queue
import sys
import time

import py_common
from py_common import WAIT_S, check, start_watchdog


class Peer(py_common.Peer):
    """One connection to `/` (default transports) queueing every `msg`,
    with the ack checks every row of the table uses."""

    def ok(self, event, data, timeout=WAIT_S):
        ack = self.call(event, data, timeout)
        if not isinstance(ack, dict) or ack.get("ok") is not True:
            raise AssertionError(f"{event} {data!r}: expected ok:true, got {ack!r}")
        return ack

    def error(self, event, data, code):
        ack = self.call(event, data)
        err = ack.get("error") if isinstance(ack, dict) else None
        if (not isinstance(ack, dict) or ack.get("ok") is not False
                or not isinstance(err, dict) or err.get("code") != code
                or not isinstance(err.get("message"), str)
                or set(ack) != {"ok", "error"}):
            raise AssertionError(f"{event} {data!r}: expected error {code!r}, got {ack!r}")


def keys(obj, want, what, optional=()):
    """`obj` is a dict with exactly the keys `want` (plus any of `optional`)."""
    if not isinstance(obj, dict):
        raise AssertionError(f"{what}: expected an object, got {obj!r}")
    have = set(obj)
    if not set(want) <= have or not have <= set(want) | set(optional):
        raise AssertionError(f"{what}: keys {sorted(have)}, expected {sorted(want)}"
                             f" (optional {sorted(optional)}): {obj!r}")
    return obj


def equal(got, want, what):
    if got != want:
        raise AssertionError(f"{what}: expected {want!r}, got {got!r}")


STATE_KEYS = ("messages", "bytes", "first_seq", "last_seq", "consumer_count")
STREAM_CONFIG_KEYS = ("name", "subjects", "retention", "max_msgs", "max_bytes",
                      "max_age_ms", "max_msg_size", "discard", "duplicate_window_ms")
CONSUMER_KEYS = ("config", "delivered", "ack_floor", "num_pending",
                 "num_ack_pending", "num_redelivered")
# The project's docs add these to the contract's consumer info.
CONSUMER_EXTRA = ("stream", "name", "num_waiting")


def stream_view(v, what):
    keys(v, ("config", "state"), what)
    keys(v["config"], STREAM_CONFIG_KEYS, f"{what} config")
    keys(v["state"], STATE_KEYS, f"{what} state")
    for k in STATE_KEYS:
        if not isinstance(v["state"][k], int):
            raise AssertionError(f"{what} state {k} is not an integer: {v!r}")
    return v


def state_of(peer, name):
    ack = keys(peer.ok("stream.info", {"name": name}), ("ok", "stream"), "stream.info")
    return stream_view(ack["stream"], "stream.info")["state"]


def numbers(state):
    return (state["messages"], state["first_seq"], state["last_seq"])


def consumer_view(v, what):
    keys(v, CONSUMER_KEYS, what, CONSUMER_EXTRA)
    for pair in ("delivered", "ack_floor"):
        keys(v[pair], ("stream_seq", "consumer_seq"), f"{what} {pair}")
    return v


def consumer_info(peer, stream, name):
    ack = keys(peer.ok("consumer.info", {"stream": stream, "name": name}),
               ("ok", "consumer"), "consumer.info")
    return consumer_view(ack["consumer"], "consumer.info")


def stored(ack, stream, seq, what, duplicate=False):
    want = {"ok": True, "stream": stream, "seq": seq}
    if duplicate:
        want["duplicate"] = True
    equal(ack, want, what)


def fetch(peer, stream, consumer, timeout=WAIT_S, **extra):
    req = {"stream": stream, "consumer": consumer, **extra}
    ack = keys(peer.ok("consumer.fetch", req, timeout), ("ok", "messages"),
               "consumer.fetch")
    if not isinstance(ack["messages"], list):
        raise AssertionError(f"consumer.fetch: messages is not a list: {ack!r}")
    for m in ack["messages"]:
        keys(m, ("seq", "subject", "data", "time", "delivered"), "fetched message",
             ("headers",))
    return ack["messages"]


def recent_time(t, what):
    now_ms = time.time() * 1000
    if not isinstance(t, int) or isinstance(t, bool) or abs(now_ms - t) > 60_000:
        raise AssertionError(f"{what}: time {t!r} is not ms since the epoch near now")


# ---- the checks -------------------------------------------------------------

def check_create_info_list(p):
    ack = keys(p.ok("stream.create", {"name": "PYS", "subjects": ["pys.>"]}),
               ("ok", "stream"), "stream.create")
    v = stream_view(ack["stream"], "stream.create")
    equal(v["config"], {"name": "PYS", "subjects": ["pys.>"], "retention": "limits",
                        "max_msgs": 0, "max_bytes": 0, "max_age_ms": 0,
                        "max_msg_size": 0, "discard": "old",
                        "duplicate_window_ms": 0}, "defaults")
    equal(v["state"], {"messages": 0, "bytes": 0, "first_seq": 0, "last_seq": 0,
                       "consumer_count": 0}, "a new stream's state")
    again = p.ok("stream.create", {"name": "PYS", "subjects": ["pys.>"],
                                   "retention": "limits", "discard": "old"})
    equal(again, ack, "the same config again")
    nulls = p.ok("stream.create", {"name": "PYS", "subjects": ["pys.>"],
                                   "max_msgs": None, "retention": None})
    equal(nulls, ack, "optional fields sent as null are their defaults")
    p.error("stream.create", {"name": "PYS", "subjects": ["pys.>"], "max_msgs": 5},
            "exists")
    equal(state_of(p, "PYS"), v["state"], "stream.info of the new stream")
    lst = keys(p.ok("stream.list", {}), ("ok", "streams"), "stream.list")
    mine = [stream_view(s, "stream.list entry") for s in lst["streams"]
            if s.get("config", {}).get("name") == "PYS"]
    equal(len(mine), 1, "PYS in stream.list")
    p.error("stream.info", {"name": "NOPE"}, "not_found")


# What a stream gives back is the very JSON value published: big integers
# stay exact and object keys keep their order.
VALUES = [{"n": 1, "list": [1, 2.5, None, True], "s": "é\"x"}, [1, "two", {}],
          "text", 42, -1.5, None, True, {}, 123456789012345678901234567890,
          {"zeta": 1, "alpha": {"y": 2, "b": 3}}]


def same_json(got, want, what):
    """Equal, with the same types (no int turned float) and key order."""
    def shape(v):
        if isinstance(v, dict):
            return ("dict", [(k, shape(x)) for k, x in v.items()])
        if isinstance(v, list):
            return ("list", [shape(x) for x in v])
        return (type(v).__name__, v)
    if shape(got) != shape(want):
        raise AssertionError(f"{what}: expected {want!r}, got {got!r}")


def check_publish_and_get(p):
    sub_sid = "core-sid"
    p.ok("sub", {"subject": "pys.data.*", "sid": sub_sid})
    seqs = []
    for i, value in enumerate(VALUES):
        ack = p.ok("pub", {"subject": f"pys.data.{i}", "data": value})
        stored(ack, "PYS", i + 1, f"pub of {value!r}")
        seqs.append(ack["seq"])
        msg = p.next_msg()
        equal(msg, {"sid": sub_sid, "subject": f"pys.data.{i}", "data": value},
              "the core delivery of a captured publish")
        same_json(msg["data"], value, "core delivery data")
    for i, value in enumerate(VALUES):
        ack = keys(p.ok("stream.get", {"name": "PYS", "seq": seqs[i]}),
                   ("ok", "message"), "stream.get")
        m = keys(ack["message"], ("seq", "subject", "data", "time"), "stream.get message")
        equal((m["seq"], m["subject"]), (seqs[i], f"pys.data.{i}"), "stream.get by seq")
        same_json(m["data"], value, "stream.get data")
        recent_time(m["time"], "stream.get")
    p.ok("consumer.create", {"stream": "PYS", "name": "raw",
                             "filter_subject": "pys.data.*"})
    got = fetch(p, "PYS", "raw", batch=len(VALUES) + 5, no_wait=True)
    equal([m["seq"] for m in got], seqs, "fetched seqs")
    for m, value in zip(got, VALUES):
        same_json(m["data"], value, "fetched data")
    equal(p.ok("consumer.delete", {"stream": "PYS", "name": "raw"}), {"ok": True},
          "consumer.delete")
    headers = {"Trace": "t-1", "Other": "ä b"}
    ack = p.ok("pub", {"subject": "pys.data.h", "data": {"h": 1}, "headers": headers})
    m = p.ok("stream.get", {"name": "PYS", "last_by_subject": "pys.data.h"})["message"]
    keys(m, ("seq", "subject", "data", "headers", "time"), "with headers")
    equal((m["seq"], m["data"], m["headers"]), (ack["seq"], {"h": 1}, headers),
          "headers round trip")
    equal(p.next_msg(), {"sid": sub_sid, "subject": "pys.data.h", "data": {"h": 1},
                         "headers": headers}, "core delivery with headers")
    m = p.ok("stream.get", {"name": "PYS", "last_by_subject": "pys.data.*"})["message"]
    equal(m["seq"], ack["seq"], "last_by_subject with a wildcard")
    p.error("stream.get", {"name": "PYS", "seq": 999}, "not_found")
    p.error("stream.get", {"name": "PYS", "last_by_subject": "pys.none"}, "not_found")
    st = state_of(p, "PYS")
    equal(numbers(st), (len(VALUES) + 1, 1, len(VALUES) + 1), "state after publishes")
    if st["bytes"] <= 0:
        raise AssertionError(f"bytes is {st['bytes']} with messages stored")


def check_purge(p):
    last = state_of(p, "PYS")["last_seq"]
    ack = keys(p.ok("stream.purge", {"name": "PYS", "subject": "pys.data.h"}),
               ("ok", "purged"), "stream.purge")
    equal(ack["purged"], 1, "purge by subject")
    ack = keys(p.ok("stream.purge", {"name": "PYS"}), ("ok", "purged"), "stream.purge")
    equal(ack["purged"], last - 1, "purge of the rest")
    st = state_of(p, "PYS")
    equal((st["messages"], st["bytes"], st["first_seq"], st["last_seq"]),
          (0, 0, last + 1, last), "an empty stream after a purge")
    stored(p.ok("pub", {"subject": "pys.after", "data": 1}), "PYS", last + 1,
           "the seq after a purge")
    equal(numbers(state_of(p, "PYS")), (1, last + 1, last + 1), "state after it")


def check_limits(p):
    p.ok("stream.create", {"name": "PYSIZE", "subjects": ["pysize.*"],
                           "max_msg_size": 64})
    p.error("pub", {"subject": "pysize.a", "data": "x" * 100}, "payload_too_large")
    stored(p.ok("pub", {"subject": "pysize.a", "data": "small"}), "PYSIZE", 1,
           "a message under max_msg_size")
    # The payload is the JSON text of data (and headers): "x" * 62 is 64
    # bytes of it, the subject not counted.
    stored(p.ok("pub", {"subject": "pysize.long-subject-name", "data": "x" * 62}),
           "PYSIZE", 2, "a payload of exactly max_msg_size")
    p.error("pub", {"subject": "pysize.a", "data": "x" * 63}, "payload_too_large")
    p.ok("stream.create", {"name": "PYNEW", "subjects": ["pynew"], "max_msgs": 2,
                           "discard": "new"})
    for seq in (1, 2):
        stored(p.ok("pub", {"subject": "pynew", "data": seq}), "PYNEW", seq, "pub")
    p.error("pub", {"subject": "pynew", "data": 3}, "limit")
    equal(numbers(state_of(p, "PYNEW")), (2, 1, 2), "discard new keeps the old ones")
    p.ok("stream.create", {"name": "PYOLD", "subjects": ["pyold"], "max_msgs": 2})
    for seq in (1, 2, 3):
        stored(p.ok("pub", {"subject": "pyold", "data": seq}), "PYOLD", seq, "pub")
    equal(numbers(state_of(p, "PYOLD")), (2, 2, 3), "discard old drops the oldest")


def check_duplicates(p):
    p.ok("stream.create", {"name": "PYDUP", "subjects": ["pydup"],
                           "duplicate_window_ms": 60000})
    h = {"Msg-Id": "m-1"}
    stored(p.ok("pub", {"subject": "pydup", "data": 1, "headers": h}), "PYDUP", 1, "first")
    stored(p.ok("pub", {"subject": "pydup", "data": 2}), "PYDUP", 2, "no id")
    stored(p.ok("pub", {"subject": "pydup", "data": 1, "headers": h}), "PYDUP", 1,
           "the same Msg-Id again", duplicate=True)
    equal(numbers(state_of(p, "PYDUP")), (2, 1, 2), "a duplicate is not stored")


def check_interest(p):
    p.ok("stream.create", {"name": "PYINT", "subjects": ["pyint"],
                           "retention": "interest"})
    stored(p.ok("pub", {"subject": "pyint", "data": 1}), "PYINT", 1,
           "a publish nobody is interested in")
    equal(numbers(state_of(p, "PYINT")), (0, 2, 1), "not kept without consumers")
    p.ok("consumer.create", {"stream": "PYINT", "name": "c"})
    stored(p.ok("pub", {"subject": "pyint", "data": 2}), "PYINT", 2, "with a consumer")
    equal(numbers(state_of(p, "PYINT")), (1, 2, 2), "kept while a consumer wants it")
    got = fetch(p, "PYINT", "c", no_wait=True)
    equal([m["seq"] for m in got], [2], "the interested consumer gets it")
    equal(p.ok("ack", {"stream": "PYINT", "consumer": "c", "seq": 2}), {"ok": True}, "ack")
    equal(numbers(state_of(p, "PYINT")), (0, 3, 2), "gone once acked")


def check_workqueue(p):
    p.ok("stream.create", {"name": "PYWQ", "subjects": ["pywq"],
                           "retention": "workqueue"})
    p.ok("consumer.create", {"stream": "PYWQ", "name": "w"})
    p.ok("pub", {"subject": "pywq", "data": "job"})
    got = fetch(p, "PYWQ", "w")
    equal([(m["seq"], m["data"]) for m in got], [(1, "job")], "fetched job")
    p.ok("ack", {"stream": "PYWQ", "consumer": "w", "seq": 1})
    equal(numbers(state_of(p, "PYWQ")), (0, 2, 1), "a workqueue message goes once acked")


def check_consumers(p):
    p.ok("stream.create", {"name": "PYC", "subjects": ["pyc.>"]})
    for i in (1, 2, 3):
        p.ok("pub", {"subject": f"pyc.{i}", "data": {"i": i},
                     "headers": {"N": str(i)}})
    ack = keys(p.ok("consumer.create", {"stream": "PYC", "name": "pull"}),
               ("ok", "consumer"), "consumer.create")
    c = consumer_view(ack["consumer"], "consumer.create")
    equal(c["config"], {"name": "pull", "deliver_policy": "all",
                        "ack_policy": "explicit", "ack_wait_ms": 30000,
                        "max_deliver": 0, "max_ack_pending": 1000},
          "consumer defaults")
    equal((c["delivered"], c["ack_floor"], c["num_pending"], c["num_ack_pending"],
           c["num_redelivered"]),
          ({"stream_seq": 0, "consumer_seq": 0}, {"stream_seq": 0, "consumer_seq": 0},
           3, 0, 0), "a new consumer's numbers")
    again = p.ok("consumer.create", {"stream": "PYC", "name": "pull",
                                     "ack_policy": "explicit"})
    equal(again["consumer"]["config"], c["config"], "the same consumer again")
    p.error("consumer.create", {"stream": "PYC", "name": "pull", "ack_wait_ms": 5},
            "exists")
    got = fetch(p, "PYC", "pull")
    equal([(m["seq"], m["subject"], m["data"], m["headers"], m["delivered"]) for m in got],
          [(1, "pyc.1", {"i": 1}, {"N": "1"}, 1)], "batch defaults to 1")
    recent_time(got[0]["time"], "fetched message")
    got = fetch(p, "PYC", "pull", batch=10)
    equal([m["seq"] for m in got], [2, 3], "a batch of the rest")
    info = consumer_info(p, "PYC", "pull")
    equal((info["delivered"], info["ack_floor"], info["num_pending"],
           info["num_ack_pending"], info["num_redelivered"]),
          ({"stream_seq": 3, "consumer_seq": 3}, {"stream_seq": 0, "consumer_seq": 0},
           0, 3, 0), "after delivering three")
    for event in ("ack", "nak", "term", "wip"):
        seq = {"ack": 1, "nak": 2, "term": 3, "wip": 2}[event]
        req = {"stream": "PYC", "consumer": "pull", "seq": seq}
        equal(p.ok(event, req), {"ok": True}, f"{event} ack")
    got = fetch(p, "PYC", "pull", batch=10)
    equal([(m["seq"], m["delivered"]) for m in got], [(2, 2)], "the nak'd one again")
    info = consumer_info(p, "PYC", "pull")
    equal((info["ack_floor"]["stream_seq"], info["num_ack_pending"],
           info["num_redelivered"]), (1, 1, 1), "after ack, nak, term")
    p.ok("ack", {"stream": "PYC", "consumer": "pull", "seq": 2, "delay_ms": 0})
    info = consumer_info(p, "PYC", "pull")
    equal((info["ack_floor"]["stream_seq"], info["num_ack_pending"]), (3, 0),
          "everything done with")
    p.error("ack", {"stream": "PYC", "consumer": "pull", "seq": 99}, "not_found")
    p.error("consumer.info", {"stream": "PYC", "name": "nope"}, "not_found")

    # ack_policy none: the ack floor moves as messages are delivered.
    p.ok("consumer.create", {"stream": "PYC", "name": "none", "ack_policy": "none"})
    got = fetch(p, "PYC", "none", batch=2)
    equal([m["seq"] for m in got], [1, 2], "ack_policy none fetch")
    info = consumer_info(p, "PYC", "none")
    equal((info["delivered"], info["ack_floor"], info["num_ack_pending"]),
          ({"stream_seq": 2, "consumer_seq": 2}, {"stream_seq": 2, "consumer_seq": 2}, 0),
          "ack_policy none moves the ack floor at delivery")

    # deliver policies
    for policy, extra, first in (("new", {}, None), ("last", {}, 3),
                                 ("by_start_seq", {"opt_start_seq": 2}, 2)):
        p.ok("consumer.create", {"stream": "PYC", "name": f"p-{policy}",
                                 "deliver_policy": policy, **extra})
        got = fetch(p, "PYC", f"p-{policy}", no_wait=True)
        equal([m["seq"] for m in got], [] if first is None else [first],
              f"deliver_policy {policy}")

    lst = keys(p.ok("consumer.list", {"stream": "PYC"}), ("ok", "consumers"),
               "consumer.list")
    names = [consumer_view(x, "consumer.list entry")["config"]["name"]
             for x in lst["consumers"]]
    equal(sorted(names), sorted(["pull", "none", "p-new", "p-last", "p-by_start_seq"]),
          "consumer.list names")
    equal(state_of(p, "PYC")["consumer_count"], 5, "consumer_count")
    equal(p.ok("consumer.delete", {"stream": "PYC", "name": "p-new"}), {"ok": True},
          "consumer.delete")
    p.error("consumer.delete", {"stream": "PYC", "name": "p-new"}, "not_found")
    equal(state_of(p, "PYC")["consumer_count"], 4, "consumer_count after a delete")


def check_fetch_waits(p, default_wait):
    """`default_wait` holds the ack of a fetch sent at the start of the run
    without `expires_ms`: it must have come back empty after about 5 s."""
    p.ok("stream.create", {"name": "PYW", "subjects": ["pyw"]})
    p.ok("consumer.create", {"stream": "PYW", "name": "c"})
    t0 = time.monotonic()
    equal(fetch(p, "PYW", "c", no_wait=True), [], "no_wait with nothing pending")
    equal(fetch(p, "PYW", "c", no_wait=True, batch=None, expires_ms=None), [],
          "optional fetch fields sent as null")
    again = p.ok("consumer.create", {"stream": "PYW", "name": "c", "filter_subject": None,
                                     "ack_policy": None, "ack_wait_ms": None})
    equal(again["consumer"]["config"]["ack_wait_ms"], 30000, "nulls in consumer.create")
    if time.monotonic() - t0 > 1.0:
        raise AssertionError("no_wait did not answer at once")
    t0 = time.monotonic()
    equal(fetch(p, "PYW", "c", expires_ms=300), [], "an expired wait")
    took = time.monotonic() - t0
    if not 0.25 <= took < 2.0:
        raise AssertionError(f"a 300 ms wait answered after {took:.3f} s")
    answers = queue.Queue()
    p.sio.emit("consumer.fetch", {"stream": "PYW", "consumer": "c", "expires_ms": 4000},
               callback=lambda ack: answers.put(ack))
    p.ok("ping", {})
    p.ok("pub", {"subject": "pyw", "data": "late"})
    ack = answers.get(timeout=WAIT_S)
    equal(ack.get("ok"), True, "a waiting fetch")
    equal([(m["seq"], m["data"]) for m in ack["messages"]], [(1, "late")],
          "a waiting fetch is answered by a publish")
    start, box = default_wait
    try:
        ack, at = box.get(timeout=8.0)
    except queue.Empty:
        raise AssertionError("a fetch without expires_ms never answered")
    equal(ack, {"ok": True, "messages": []}, "the default wait's answer")
    took = at - start
    if not 4.5 <= took < 7.5:
        raise AssertionError(f"the default expires_ms waited {took:.2f} s, not about 5")


def start_default_wait(p):
    p.ok("stream.create", {"name": "PYDW", "subjects": ["pydw"]})
    p.ok("consumer.create", {"stream": "PYDW", "name": "c"})
    box = queue.Queue()
    start = time.monotonic()
    p.sio.emit("consumer.fetch", {"stream": "PYDW", "consumer": "c"},
               callback=lambda ack: box.put((ack, time.monotonic())))
    return start, box


def check_push(url, p):
    s1, s2 = Peer(url), Peer(url)
    try:
        p.ok("stream.create", {"name": "PYP", "subjects": ["pyp.>"]})
        p.ok("pub", {"subject": "pyp.a", "data": {"k": "v"}, "headers": {"H": "1"}})
        s1.ok("sub", {"subject": "push.py", "sid": "mine-1"})
        p.ok("consumer.create", {"stream": "PYP", "name": "push",
                                 "deliver_subject": "push.py"})
        msg = s1.next_msg()
        equal(msg, {"sid": "mine-1", "subject": "pyp.a", "data": {"k": "v"},
                    "headers": {"H": "1"}, "stream": "PYP", "consumer": "push",
                    "seq": 1, "delivered": 1}, "a push delivery")
        p.ok("ack", {"stream": "PYP", "consumer": "push", "seq": 1})
        # deliver_group: only members of that queue group get it.
        s1.ok("sub", {"subject": "push.grp", "sid": "plain"})
        s2.ok("sub", {"subject": "push.grp", "sid": "member", "queue": "g"})
        p.ok("consumer.create", {"stream": "PYP", "name": "grp",
                                 "deliver_subject": "push.grp", "deliver_group": "g",
                                 "ack_policy": "none"})
        msg = s2.next_msg()
        equal(msg, {"sid": "member", "subject": "pyp.a", "data": {"k": "v"},
                    "headers": {"H": "1"}, "stream": "PYP", "consumer": "grp",
                    "seq": 1, "delivered": 1}, "a push delivery to the group")
        s1.ok("ping", {})
        extra = s1.next_msg(wait=0.3)
        equal(extra, None, "nothing for a subscriber outside deliver_group")
        info = consumer_info(p, "PYP", "grp")
        equal(info["ack_floor"]["stream_seq"], 1, "push with ack_policy none")
        p.error("consumer.fetch", {"stream": "PYP", "consumer": "push"}, "bad_request")
    finally:
        s1.close()
        s2.close()


def is_bytes(got, want, what):
    if not isinstance(got, (bytes, bytearray)) or bytes(got) != want:
        raise AssertionError(f"{what}: expected {len(want)} bytes, got {got!r}")


def check_binary(url, p):
    """Binary data in a stream: stored as bytes, returned as bytes."""
    blob = bytes(range(256)) + b"\xff\x00tail"
    small = b"\x00\x01"
    sub = Peer(url)
    try:
        p.ok("stream.create", {"name": "PYB", "subjects": ["pyb.>"],
                               "max_msg_size": len(blob)})
        stored(p.ok("pub", {"subject": "pyb.a", "data": blob}), "PYB", 1,
               "a pub of bytes (the ack is plain)")
        stored(p.ok("pub", {"subject": "pyb.b", "data": "json"}), "PYB", 2, "a pub of JSON")
        stored(p.ok("pub", {"subject": "pyb.b", "data": small}), "PYB", 3, "more bytes")
        # max_msg_size counts the bytes themselves.
        p.error("pub", {"subject": "pyb.a", "data": blob + b"!"}, "payload_too_large")
        # Only the whole of data may be an attachment.
        p.error("pub", {"subject": "pyb.a", "data": {"blob": small}}, "bad_request")
        m = keys(p.ok("stream.get", {"name": "PYB", "seq": 1}), ("ok", "message"),
                 "stream.get")["message"]
        keys(m, ("seq", "subject", "data", "time"), "stream.get of bytes")
        is_bytes(m["data"], blob, "stream.get data")
        m = p.ok("stream.get", {"name": "PYB", "last_by_subject": "pyb.b"})["message"]
        equal(m["seq"], 3, "last_by_subject")
        is_bytes(m["data"], small, "stream.get last_by_subject data")
        p.ok("consumer.create", {"stream": "PYB", "name": "pull"})
        got = fetch(p, "PYB", "pull", batch=10, no_wait=True)
        equal([m["seq"] for m in got], [1, 2, 3], "fetched seqs")
        is_bytes(got[0]["data"], blob, "fetched data 1")
        equal(got[1]["data"], "json", "fetched data 2")
        is_bytes(got[2]["data"], small, "fetched data 3")
        sub.ok("sub", {"subject": "push.pyb", "sid": "b"})
        p.ok("consumer.create", {"stream": "PYB", "name": "push",
                                 "deliver_subject": "push.pyb", "ack_policy": "none"})
        for seq, want in ((1, blob), (2, "json"), (3, small)):
            msg = sub.next_msg()
            if not isinstance(msg, dict):
                raise AssertionError(f"push delivery {seq}: got {msg!r}")
            data = msg.pop("data", None)
            equal(msg, {"sid": "b", "subject": "pyb.a" if seq == 1 else "pyb.b",
                        "stream": "PYB", "consumer": "push", "seq": seq,
                        "delivered": 1}, f"push delivery {seq}")
            if isinstance(want, bytes):
                is_bytes(data, want, f"push delivery {seq} data")
            else:
                equal(data, want, f"push delivery {seq} data")
    finally:
        sub.close()


def check_delete(p):
    for name in ("PYS", "PYSIZE", "PYNEW", "PYOLD", "PYDUP", "PYINT", "PYWQ", "PYC",
                 "PYW", "PYDW", "PYP", "PYB"):
        equal(p.ok("stream.delete", {"name": name}), {"ok": True}, f"delete {name}")
    p.error("stream.info", {"name": "PYS"}, "not_found")
    p.error("stream.delete", {"name": "PYS"}, "not_found")
    ack = p.ok("pub", {"subject": "pys.gone", "data": 1})
    equal(ack, {"ok": True}, "a pub after its stream was deleted")


def main():
    if len(sys.argv) < 2:
        print("usage: py_streams.py URL [...]", file=sys.stderr)
        return 2
    url = sys.argv[1]
    start_watchdog()
    p = Peer(url)
    waiter = Peer(url)
    default_wait = start_default_wait(waiter)
    check("create_info_list", lambda: check_create_info_list(p))
    check("publish_get", lambda: check_publish_and_get(p))
    check("purge", lambda: check_purge(p))
    check("limits", lambda: check_limits(p))
    check("duplicates", lambda: check_duplicates(p))
    check("interest", lambda: check_interest(p))
    check("workqueue", lambda: check_workqueue(p))
    check("consumers", lambda: check_consumers(p))
    check("push", lambda: check_push(url, p))
    check("fetch_waits", lambda: check_fetch_waits(p, default_wait))
    check("binary", lambda: check_binary(url, p))
    check("delete", lambda: check_delete(p))
    waiter.close()
    p.close()
    return py_common.summary()


if __name__ == "__main__":
    sys.exit(main())
