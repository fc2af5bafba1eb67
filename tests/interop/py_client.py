"""Interop checks with the unmodified python-socketio 5.x client.

Usage: py_client.py URL CONTROL_TOKEN [MODE]   (URL like http://127.0.0.1:PORT)

MODE picks the transports: `websocket` (the default here: WebSocket only),
`default` (the client's own default: long-polling first, then the upgrade to
WebSocket) or `polling` (long-polling only, no upgrade).

Prints one line per check, `PASS <name>` or `FAIL <name>: <detail>`, and
exits 1 if any check failed. Every wait is bounded by WAIT_S; a watchdog ends
the process if the whole run outlasts RUN_MAX_S, so a broken server can make
this script fail but never hang. tests/interop.rs runs it and lists the check
names it expects, so a rename here must be made there too.
"""

import queue
import sys
import time

import socketio

import py_common
from py_common import WAIT_S, check, start_watchdog

# Per mode: the transports passed to connect (None: the client's default)
# and the Engine.IO transport a connection must end up on.
MODES = {
    "websocket": (["websocket"], "websocket"),
    "default": (None, "websocket"),
    "polling": (["polling"], "polling"),
}
TRANSPORTS, FINAL_TRANSPORT = MODES["websocket"]


class Peer(py_common.Peer):
    """One connection to `/` on this run's transports."""

    def __init__(self, url):
        super().__init__(url, transports=TRANSPORTS)


def expect_ok(ack, what):
    if not isinstance(ack, dict) or ack.get("ok") is not True:
        raise AssertionError(f"{what}: expected an ack with ok:true, got {ack!r}")
    return ack


def expect_error(ack, code, what):
    error = ack.get("error") if isinstance(ack, dict) else None
    if (not isinstance(ack, dict) or ack.get("ok") is not False
            or not isinstance(error, dict) or error.get("code") != code):
        raise AssertionError(f"{what}: expected error code {code!r}, got {ack!r}")


def subscribe(peer, subject):
    ack = expect_ok(peer.call("sub", {"subject": subject}), f"sub {subject}")
    sid = ack.get("sid")
    if not isinstance(sid, str) or not sid:
        raise AssertionError(f"sub {subject}: ack has no string sid: {ack!r}")
    return sid


def check_connect(url):
    peer = Peer(url)
    try:
        if not peer.sio.connected or not peer.sio.get_sid("/"):
            raise AssertionError("connected without a namespace sid")
        expect_ok(peer.call("ping", {}), "ping")
        # The transport the mode asks for is the one in use (after an
        # upgrade, when there is one).
        deadline = time.monotonic() + WAIT_S
        while (peer.sio.transport() != FINAL_TRANSPORT
               and time.monotonic() < deadline):
            expect_ok(peer.call("ping", {}), "ping while upgrading")
            time.sleep(0.05)
        if peer.sio.transport() != FINAL_TRANSPORT:
            raise AssertionError(f"on transport {peer.sio.transport()!r}, "
                                 f"expected {FINAL_TRANSPORT!r}")
        expect_ok(peer.call("ping", {}), "ping on the final transport")
    finally:
        peer.close()


def check_control(url, token):
    sio = socketio.Client(reconnection=False)
    sio.connect(url, transports=TRANSPORTS, namespaces=["/control"],
                auth={"token": token}, wait_timeout=WAIT_S)
    try:
        info = expect_ok(sio.call("server.info", {}, namespace="/control",
                                  timeout=WAIT_S), "server.info")
        if not isinstance(info.get("node_id"), str) or not info["node_id"]:
            raise AssertionError(f"server.info has no node_id: {info!r}")
    finally:
        sio.disconnect()


def check_control_refused(url, token):
    sio = socketio.Client(reconnection=False)
    errors = queue.Queue()
    sio.on("connect_error", errors.put, namespace="/control")
    try:
        sio.connect(url, transports=TRANSPORTS, namespaces=["/control"],
                    auth={"token": token + "-wrong"}, wait_timeout=WAIT_S)
    except socketio.exceptions.ConnectionError:
        pass
    else:
        sio.disconnect()
        raise AssertionError("a wrong token was accepted")
    try:
        data = errors.get(timeout=WAIT_S)
    except queue.Empty:
        raise AssertionError("refused, but no connect_error data arrived")
    message = data.get("message") if isinstance(data, dict) else data
    if message != "unauthorized":
        raise AssertionError(f"expected message 'unauthorized', got {data!r}")


def check_pubsub(url):
    sub, pub = Peer(url), Peer(url)
    try:
        sid = subscribe(sub, "interop.*.x")
        expect_ok(pub.call("pub", {"subject": "interop.a.x", "data": {"n": 1}}),
                  "pub interop.a.x")
        msg = sub.next_msg()
        want = {"sid": sid, "subject": "interop.a.x", "data": {"n": 1}}
        if not isinstance(msg, dict) or {k: msg.get(k) for k in want} != want:
            raise AssertionError(f"expected msg {want!r}, got {msg!r}")
        # A subject the pattern does not match, then a barrier: the ping ack
        # says the pub was processed; the sentinel that does match must be
        # the next thing the subscriber sees.
        expect_ok(pub.call("pub", {"subject": "interop.a.y", "data": 2}),
                  "pub interop.a.y")
        expect_ok(pub.call("ping", {}), "ping")
        expect_ok(pub.call("pub", {"subject": "interop.end.x", "data": 3}),
                  "pub interop.end.x")
        msg = sub.next_msg()
        if not isinstance(msg, dict) or msg.get("subject") != "interop.end.x":
            raise AssertionError(f"expected the sentinel interop.end.x, got {msg!r}")
    finally:
        sub.close()
        pub.close()


def check_request_reply(url):
    responder, requester = Peer(url), Peer(url)
    replies = queue.Queue()

    def echo(msg):
        reply = msg.get("reply") if isinstance(msg, dict) else None
        replies.put(reply)
        if reply:
            responder.sio.emit("pub", {"subject": reply, "data": msg.get("data")})

    try:
        responder.sio.on("msg", echo)
        subscribe(responder, "svc.echo")
        ack = expect_ok(requester.call("request", {
            "subject": "svc.echo", "data": "hi", "timeout_ms": 2000}), "request")
        seen_reply = replies.get(timeout=WAIT_S)
        if ack.get("data") != "hi" or ack.get("subject") != seen_reply:
            raise AssertionError(
                f"expected data 'hi' on subject {seen_reply!r}, got {ack!r}")
    finally:
        responder.close()
        requester.close()


def check_error_acks(url):
    peer = Peer(url)
    try:
        expect_error(peer.call("sub", {"subject": "bad..subject"}),
                     "bad_subject", "sub bad..subject")
        expect_error(peer.call("request", {"subject": "interop.nobody.home",
                                           "data": 1, "timeout_ms": 2000}),
                     "no_responders", "request to a subject with no subscriber")
        expect_ok(peer.call("ping", {}), "ping after the errors")
    finally:
        peer.close()


def check_binary(url):
    sub, pub = Peer(url), Peer(url)
    payload = bytes(range(256)) * 3 + b"\x00end"
    try:
        sid = subscribe(sub, "interop.bin")
        expect_ok(pub.call("pub", {"subject": "interop.bin", "data": payload}),
                  "pub bytes")
        msg = sub.next_msg()
        if not isinstance(msg, dict) or msg.get("sid") != sid:
            raise AssertionError(f"expected a msg for sid {sid!r}, got {msg!r}")
        data = msg.get("data")
        if not isinstance(data, (bytes, bytearray)) or bytes(data) != payload:
            shown = data if not isinstance(data, (bytes, bytearray)) else (
                f"{len(data)} bytes starting {bytes(data[:16])!r}")
            raise AssertionError(f"expected {len(payload)} equal bytes, got {shown!r}")
    finally:
        sub.close()
        pub.close()


def check_streams(url):
    """A stream over interop.stream.>, a publish acked with its seq, a pull
    consumer fetching it, an ack, and the consumer's numbers after it."""
    peer = Peer(url)
    try:
        created = expect_ok(peer.call("stream.create", {
            "name": "INTEROP", "subjects": ["interop.stream.>"]}), "stream.create")
        if created["stream"]["config"]["name"] != "INTEROP":
            raise AssertionError(f"stream.create answered {created!r}")
        acks = [expect_ok(peer.call("pub", {"subject": "interop.stream.a",
                                            "data": {"n": n}}), "pub")
                for n in (1, 2)]
        if [(a.get("stream"), a.get("seq")) for a in acks] != [("INTEROP", 1), ("INTEROP", 2)]:
            raise AssertionError(f"pub acks without stream and seq: {acks!r}")
        expect_ok(peer.call("consumer.create", {"stream": "INTEROP", "name": "py"}),
                  "consumer.create")
        got = expect_ok(peer.call("consumer.fetch", {
            "stream": "INTEROP", "consumer": "py", "batch": 10,
            "expires_ms": 1000}), "consumer.fetch")
        msgs = got.get("messages")
        if [(m["seq"], m["data"], m["delivered"]) for m in msgs] != [(1, {"n": 1}, 1), (2, {"n": 2}, 1)]:
            raise AssertionError(f"fetch answered {got!r}")
        expect_ok(peer.call("ack", {"stream": "INTEROP", "consumer": "py", "seq": 1}), "ack")
        info = expect_ok(peer.call("consumer.info", {"stream": "INTEROP", "name": "py"}),
                         "consumer.info")["consumer"]
        if (info["ack_floor"]["stream_seq"], info["num_ack_pending"], info["num_pending"]) != (1, 1, 0):
            raise AssertionError(f"consumer.info after one ack: {info!r}")
        expect_error(peer.call("ack", {"stream": "INTEROP", "consumer": "py", "seq": 9}),
                     "not_found", "ack of a seq never delivered")
        expect_ok(peer.call("stream.delete", {"name": "INTEROP"}), "stream.delete")
    finally:
        peer.close()


def main():
    global TRANSPORTS, FINAL_TRANSPORT
    if len(sys.argv) not in (3, 4) or sys.argv[3:] and sys.argv[3] not in MODES:
        print("usage: py_client.py URL CONTROL_TOKEN [websocket|default|polling]",
              file=sys.stderr)
        return 2
    url, token = sys.argv[1], sys.argv[2]
    TRANSPORTS, FINAL_TRANSPORT = MODES[sys.argv[3] if len(sys.argv) == 4 else "websocket"]
    start_watchdog()
    check("connect", lambda: check_connect(url))
    check("control_info", lambda: check_control(url, token))
    check("control_unauthorized", lambda: check_control_refused(url, token))
    check("pubsub_wildcard", lambda: check_pubsub(url))
    check("request_reply", lambda: check_request_reply(url))
    check("error_acks", lambda: check_error_acks(url))
    check("binary", lambda: check_binary(url))
    check("streams", lambda: check_streams(url))
    return py_common.summary()


if __name__ == "__main__":
    sys.exit(main())
