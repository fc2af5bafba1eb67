// Interop checks with the unmodified socket.io-client 2.x, which speaks
// Engine.IO v3 (`EIO=3`: the client pings, `/` is joined without a CONNECT)
// and Socket.IO protocol v4.
//
// Usage: node client.mjs URL CONTROL_TOKEN [MODE]   (URL like http://127.0.0.1:PORT)
//
// MODE: `default` (long-polling first, then the upgrade to WebSocket, as
// the client does unless told otherwise) or `polling` (no upgrade).
// Prints one line per check, `PASS <name>` or `FAIL <name>: <detail>`, and
// exits 1 if any check failed. Every wait is bounded by WAIT_MS and a
// watchdog ends the run after RUN_MAX_MS. tests/interop.rs lists the check
// names it expects. The token reaches `/control` the v3 way, as a query on
// the namespace.

import io from "socket.io-client";
import { isDeepStrictEqual } from "node:util";

const WAIT_MS = 5000;
const RUN_MAX_MS = 50000;

const MODES = {
  default: { options: {}, transport: "websocket" },
  polling: { options: { transports: ["polling"] }, transport: "polling" },
};
let mode = MODES.default;

const results = [];

function report(name, error) {
  results.push(error === null);
  console.log(error === null ? `PASS ${name}` : `FAIL ${name}: ${error}`);
}

function show(value) {
  try {
    return JSON.stringify(value);
  } catch {
    return String(value);
  }
}

// Rejects after WAIT_MS unless `promise` settles first.
function bounded(promise, what) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out waiting for ${what}`)), WAIT_MS);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

// One connection to `/` that queues every `msg` event it receives.
class Peer {
  static async open(url) {
    const socket = io(url, {
      ...mode.options,
      reconnection: false,
      forceNew: true,
      timeout: WAIT_MS,
    });
    const peer = new Peer(socket);
    await bounded(
      new Promise((resolve, reject) => {
        socket.once("connect", resolve);
        socket.once("connect_error", (err) => reject(new Error(`connect_error: ${err}`)));
        socket.once("error", (err) => reject(new Error(`error: ${show(err)}`)));
      }),
      "connect to /",
    );
    return peer;
  }

  constructor(socket) {
    this.socket = socket;
    this.queued = [];
    this.waiting = [];
    socket.on("msg", (msg) => {
      const waiter = this.waiting.shift();
      if (waiter) waiter(msg);
      else this.queued.push(msg);
    });
  }

  call(event, data) {
    return bounded(new Promise((resolve) => this.socket.emit(event, data, resolve)), `ack of ${event}`);
  }

  nextMsg() {
    if (this.queued.length > 0) return Promise.resolve(this.queued.shift());
    return bounded(new Promise((resolve) => this.waiting.push(resolve)), "a msg event");
  }

  close() {
    this.socket.close();
  }
}

function expectOk(ack, what) {
  if (ack === null || typeof ack !== "object" || ack.ok !== true) {
    throw new Error(`${what}: expected an ack with ok:true, got ${show(ack)}`);
  }
  return ack;
}

// An acked request with no effect. (The `ping` request cannot be used:
// socket.io-client 2.x keeps the event names ping and pong for itself and
// never sends them.)
function barrier(peer) {
  return peer.call("pub", { subject: "legacy.barrier", data: null });
}

async function subscribe(peer, subject) {
  const ack = expectOk(await peer.call("sub", { subject }), `sub ${subject}`);
  if (typeof ack.sid !== "string" || ack.sid === "") {
    throw new Error(`sub ${subject}: ack has no string sid: ${show(ack)}`);
  }
  return ack.sid;
}

async function check(name, body) {
  try {
    await body();
    report(name, null);
  } catch (err) {
    report(name, err?.message ?? String(err));
  }
}

async function withPeers(url, count, body) {
  const peers = [];
  try {
    for (let i = 0; i < count; i++) peers.push(await Peer.open(url));
    await body(...peers);
  } finally {
    for (const peer of peers) peer.close();
  }
}

async function checkConnect(url) {
  await withPeers(url, 1, async (peer) => {
    const engine = peer.socket.io.engine;
    if (engine.transport.query.EIO !== 3) {
      throw new Error(`expected an EIO=3 session, got EIO=${engine.transport.query.EIO}`);
    }
    expectOk(await barrier(peer), "barrier");
    if (engine.transport.name !== mode.transport) {
      await bounded(new Promise((resolve) => engine.once("upgrade", resolve)), "the upgrade");
    }
    if (engine.transport.name !== mode.transport) {
      throw new Error(`on transport ${engine.transport.name}, expected ${mode.transport}`);
    }
    expectOk(await barrier(peer), "barrier on the final transport");
  });
}

async function checkPubSub(url) {
  await withPeers(url, 2, async (sub, pub) => {
    const sid = await subscribe(sub, "legacy.*.x");
    expectOk(await pub.call("pub", { subject: "legacy.a.x", data: { n: 1, s: "é€😀" } }), "pub");
    const msg = await sub.nextMsg();
    const want = { sid, subject: "legacy.a.x", data: { n: 1, s: "é€😀" } };
    const got = { sid: msg?.sid, subject: msg?.subject, data: msg?.data };
    if (!isDeepStrictEqual(got, want)) {
      throw new Error(`expected msg ${show(want)}, got ${show(msg)}`);
    }
    expectOk(await pub.call("pub", { subject: "legacy.a.y", data: 2 }), "pub legacy.a.y");
    expectOk(await barrier(pub), "barrier");
    expectOk(await pub.call("pub", { subject: "legacy.end.x", data: 3 }), "pub legacy.end.x");
    const next = await sub.nextMsg();
    if (next?.subject !== "legacy.end.x") {
      throw new Error(`expected the sentinel legacy.end.x, got ${show(next)}`);
    }
  });
}

async function checkRequestReply(url) {
  await withPeers(url, 2, async (responder, requester) => {
    let seenReply = null;
    responder.socket.on("msg", (msg) => {
      seenReply = msg?.reply ?? null;
      if (seenReply) responder.socket.emit("pub", { subject: seenReply, data: msg.data });
    });
    await subscribe(responder, "legacy.echo");
    const ack = expectOk(
      await requester.call("request", { subject: "legacy.echo", data: "hi", timeout_ms: 2000 }),
      "request",
    );
    if (ack.data !== "hi" || ack.subject !== seenReply) {
      throw new Error(`expected data "hi" on subject ${seenReply}, got ${show(ack)}`);
    }
  });
}

async function checkControl(url, token) {
  for (const [given, wanted] of [[token, "ok"], [`${token}-wrong`, "refused"]]) {
    const socket = io(`${url}/control`, {
      ...mode.options,
      reconnection: false,
      forceNew: true,
      timeout: WAIT_MS,
      query: { token: given },
    });
    try {
      const outcome = await bounded(
        new Promise((resolve) => {
          socket.once("connect", () => resolve("ok"));
          socket.once("error", (err) => resolve(err === "unauthorized" || err?.message === "unauthorized" ? "refused" : `error ${show(err)}`));
        }),
        `connect to /control with token ${given}`,
      );
      if (outcome !== wanted) throw new Error(`token ${given}: expected ${wanted}, got ${outcome}`);
      if (outcome === "ok") {
        const info = await bounded(
          new Promise((resolve) => socket.emit("server.info", {}, resolve)),
          "server.info",
        );
        expectOk(info, "server.info");
      }
    } finally {
      socket.close();
    }
  }
}

async function main() {
  const [url, token, modeName = "default"] = process.argv.slice(2);
  if (!url || token === undefined || !MODES[modeName]) {
    console.error("usage: node client.mjs URL CONTROL_TOKEN [default|polling]");
    return 2;
  }
  mode = MODES[modeName];
  const watchdog = setTimeout(() => {
    console.log(`FAIL watchdog: run exceeded ${RUN_MAX_MS / 1000} s`);
    process.exit(3);
  }, RUN_MAX_MS);
  await check("connect", () => checkConnect(url));
  await check("control", () => checkControl(url, token));
  await check("pubsub_wildcard", () => checkPubSub(url));
  await check("request_reply", () => checkRequestReply(url));
  clearTimeout(watchdog);
  const failed = results.filter((ok) => !ok).length;
  console.log(`summary: ${results.length - failed} of ${results.length} checks passed`);
  return failed === 0 ? 0 : 1;
}

main().then(
  (code) => process.exit(code),
  (err) => {
    console.error(err);
    process.exit(1);
  },
);
