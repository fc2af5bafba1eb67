"""A python-socketio client as an innocent bystander (tests/socket_identity.rs).

It joins `/` over the given transport, subscribes to `bystander.mark` under
its own sid `mine`, prints READY, and then reads `msg` events until the
mark arrives. The test publishes to another client's subject first and the
mark last, on the same broker, so everything meant for this socket is in
before the mark. Any `msg` with a sid other than `mine` is another client's
message: FAIL. After the verdict it stays connected until its stdin closes.

Usage: py_bystander.py URL websocket|polling
"""

import os
import queue
import sys

import socketio

from py_common import WAIT_S, start_watchdog


def main():
    url, transport = sys.argv[1], sys.argv[2]
    start_watchdog()
    sio = socketio.Client(reconnection=False)
    msgs = queue.Queue()
    sio.on("msg", msgs.put)
    sio.connect(url, transports=[transport], namespaces=["/"],
                wait_timeout=WAIT_S)
    ack = sio.call("sub", {"subject": "bystander.mark", "sid": "mine"},
                   timeout=WAIT_S)
    if not ack.get("ok"):
        print(f"FAIL bystander: sub refused: {ack}", flush=True)
        return 1
    print("READY", flush=True)
    got = []
    try:
        while True:
            m = msgs.get(timeout=WAIT_S)
            got.append(m)
            if m.get("subject") == "bystander.mark":
                break
    except queue.Empty:
        print(f"FAIL bystander: no mark within {WAIT_S} s; got {got}",
              flush=True)
        return 1
    foreign = [m for m in got if m.get("sid") != "mine"]
    if foreign:
        print(f"FAIL bystander: received another client's messages: {foreign}",
              flush=True)
        return 1
    print("PASS bystander", flush=True)
    # Stays connected (its subscription counted) until the test closes
    # this script's stdin.
    sys.stdin.readline()
    if transport == "websocket":
        sio.disconnect()
    # On polling, python-engineio's disconnect can wait for the next ping
    # to end its long poll; the verdict is printed, so the process just
    # ends and the broker sees the connection go.
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)
