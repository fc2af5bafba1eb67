"""Users and permissions (docs/PROTOCOL.md §11) through python-socketio.

Usage: python py_users.py URL CONTROL_TOKEN [MODE]

The broker runs with -users tests/users/users.json; the tokens below are
that file's. One PASS/FAIL line per check, exit 1 if any failed.
"""

import queue
import sys

import socketio

from py_common import WAIT_S, Peer, check, start_watchdog, summary

MODES = {"websocket": ["websocket"], "default": None, "polling": ["polling"]}
TRANSPORTS = None


class User(Peer):
    def __init__(self, url, token):
        self.sio = socketio.Client(reconnection=False)
        self.msgs = queue.Queue()
        self.sio.on("msg", self.msgs.put)
        self.sio.connect(url, transports=TRANSPORTS, namespaces=["/"],
                         auth={"token": token}, wait_timeout=WAIT_S)


def expect_code(ack, code, what):
    err = (ack or {}).get("error") or {}
    if ack is None or ack.get("ok") is not False or err.get("code") != code:
        raise AssertionError(f"{what}: expected {code}, got {ack!r}")


def expect_ok(ack, what):
    if not (ack or {}).get("ok"):
        raise AssertionError(f"{what}: expected ok, got {ack!r}")


def check_unauthorized(url):
    for auth in ({"token": "nope"}, None):
        sio = socketio.Client(reconnection=False)
        errors = queue.Queue()
        sio.on("connect_error", errors.put, namespace="/")
        try:
            sio.connect(url, transports=TRANSPORTS, namespaces=["/"],
                        auth=auth, wait_timeout=WAIT_S)
        except socketio.exceptions.ConnectionError:
            pass
        else:
            sio.disconnect()
            raise AssertionError(f"auth={auth!r}: admitted")
        try:
            data = errors.get(timeout=WAIT_S)
        except queue.Empty:
            raise AssertionError(f"auth={auth!r}: refused, but no connect_error data")
        message = data.get("message") if isinstance(data, dict) else data
        if message != "unauthorized":
            raise AssertionError(f"auth={auth!r}: refused with {data!r}")


def check_publish(url):
    admin, billing = User(url, "tok-admin"), User(url, "tok-billing")
    try:
        expect_ok(admin.call("sub", {"subject": "py.>", "sid": "all"}), "admin sub")
        expect_ok(admin.call("sub", {"subject": "orders.>", "sid": "o"}), "admin sub")
        expect_code(billing.call("pub", {"subject": "py.x", "data": 1}),
                    "forbidden", "pub outside allow")
        expect_code(billing.call("pub", {"subject": "orders.internal.a", "data": 1}),
                    "forbidden", "pub under deny")
        expect_code(billing.call("request", {"subject": "py.x", "data": 1}),
                    "forbidden", "request outside allow")
        billing.sio.emit("pub", {"subject": "orders.internal.b", "data": "dropped"})
        expect_ok(billing.call("pub", {"subject": "orders.py", "data": "ok"}), "allowed")
        msg = admin.next_msg()
        if not msg or msg["subject"] != "orders.py":
            raise AssertionError(f"expected orders.py first, got {msg!r}")
    finally:
        admin.close()
        billing.close()


def check_subscribe(url):
    admin, billing = User(url, "tok-admin"), User(url, "tok-billing")
    try:
        for pattern in ("billing.*", "orders.internal.>", ">", "*.new"):
            expect_code(billing.call("sub", {"subject": pattern}), "forbidden", pattern)
        expect_ok(billing.call("sub", {"subject": "orders.>", "sid": "w"}), "orders.>")
        expect_ok(admin.call("pub", {"subject": "orders.internal.x", "data": 1}), "pub")
        expect_ok(admin.call("pub", {"subject": "orders.y", "data": 2}), "pub")
        msg = billing.next_msg()
        if not msg or msg["data"] != 2:
            raise AssertionError(f"the deny cut let through {msg!r}")
    finally:
        admin.close()
        billing.close()


def check_responses(url):
    admin, service = User(url, "tok-admin"), User(url, "tok-service")
    try:
        expect_ok(service.call("sub", {"subject": "svc.py", "sid": "s"}), "service sub")
        expect_code(service.call("pub", {"subject": "svc.py", "data": 1}),
                    "forbidden", "service publish")
        answers = []
        admin.sio.emit("request", {"subject": "svc.py", "data": "q", "timeout_ms": 4000},
                       callback=answers.append)
        req = service.next_msg()
        if not req or not req.get("reply"):
            raise AssertionError(f"no request delivered: {req!r}")
        expect_ok(service.call("pub", {"subject": req["reply"], "data": "a"}), "answer")
        expect_code(service.call("pub", {"subject": req["reply"], "data": "b"}),
                    "forbidden", "second answer")
        admin.call("ping", {})
        if not answers or answers[0].get("data") != "a":
            raise AssertionError(f"request ack: {answers!r}")
    finally:
        admin.close()
        service.close()


def check_streams(url):
    admin, billing = User(url, "tok-admin"), User(url, "tok-billing")
    try:
        for name in ("ORDERS", "OTHER"):
            ack = admin.call("stream.create",
                             {"name": name, "subjects": [f"py.stored.{name}.>"]})
            expect_ok(ack, f"create {name}")
        expect_code(billing.call("stream.create", {"name": "X", "subjects": ["x.>"]}),
                    "forbidden", "create")
        expect_code(billing.call("stream.info", {"name": "OTHER"}), "forbidden", "info")
        expect_ok(billing.call("stream.info", {"name": "ORDERS"}), "info ORDERS")
        listed = billing.call("stream.list", {})
        names = [s["config"]["name"] for s in listed["streams"]]
        if names != ["ORDERS"]:
            raise AssertionError(f"stream.list: {names!r}")
    finally:
        admin.close()
        billing.close()


def main():
    global TRANSPORTS
    if len(sys.argv) not in (3, 4):
        print("usage: py_users.py URL CONTROL_TOKEN [MODE]")
        return 2
    TRANSPORTS = MODES[sys.argv[3] if len(sys.argv) == 4 else "websocket"]
    url = sys.argv[1]
    start_watchdog()
    check("unauthorized", lambda: check_unauthorized(url))
    check("publish", lambda: check_publish(url))
    check("subscribe", lambda: check_subscribe(url))
    check("responses", lambda: check_responses(url))
    check("streams", lambda: check_streams(url))
    return summary()


if __name__ == "__main__":
    sys.exit(main())
