"""What the python-socketio interop scripts (py_client.py, py_streams.py)
share: the bounds on every wait, the PASS/FAIL report lines and their
summary, the watchdog that ends a run that hangs, and `Peer`, one
connection to `/` that queues every `msg` event it receives.

The scripts import it from their own folder (Python puts a script's folder
first on its import path).
"""

import os
import queue
import threading

import socketio

WAIT_S = 5.0
RUN_MAX_S = 50.0

results = []


def report(name, error):
    line = f"PASS {name}" if error is None else f"FAIL {name}: {error}"
    results.append(error is None)
    print(line, flush=True)


def check(name, body):
    try:
        body()
    except Exception as exc:  # every failure becomes one FAIL line
        report(name, f"{type(exc).__name__}: {exc}")
    else:
        report(name, None)


def summary():
    """Prints the summary line; returns the exit status (1 if any failed)."""
    failed = results.count(False)
    print(f"summary: {len(results) - failed} of {len(results)} checks passed",
          flush=True)
    return 0 if failed == 0 else 1


def start_watchdog():
    def expire():
        print(f"FAIL watchdog: run exceeded {RUN_MAX_S:.0f} s", flush=True)
        os._exit(3)

    timer = threading.Timer(RUN_MAX_S, expire)
    timer.daemon = True
    timer.start()


class Peer:
    """One connection to `/` that queues every `msg` event it receives.

    `transports` goes to the client's connect as is (None: its default,
    long-polling first, then the upgrade to WebSocket)."""

    def __init__(self, url, transports=None):
        self.sio = socketio.Client(reconnection=False)
        self.msgs = queue.Queue()
        self.sio.on("msg", self.msgs.put)
        self.sio.connect(url, transports=transports, namespaces=["/"],
                         wait_timeout=WAIT_S)

    def call(self, event, data, timeout=WAIT_S):
        return self.sio.call(event, data, timeout=timeout)

    def next_msg(self, wait=WAIT_S):
        try:
            return self.msgs.get(timeout=wait)
        except queue.Empty:
            return None

    def close(self):
        self.sio.disconnect()
