// Interop checks with the unmodified socket.io-client 4.x.
//
// Usage: node client.mjs URL CONTROL_TOKEN [MODE]   (URL like http://127.0.0.1:PORT)
//
// MODE picks the transports: `websocket` (the default here: WebSocket
// only), `default` (the client's own default: long-polling first, then
// the upgrade to WebSocket) or `polling` (long-polling with upgrades off).
//
// Prints one line per check, `PASS <name>` or `FAIL <name>: <detail>`, and
// exits 1 if any check failed. Every wait is bounded by WAIT_MS and a
// watchdog ends the run after RUN_MAX_MS, so a broken server can make this
// fail but never hang. tests/interop.rs lists the check names it expects.

import { io } from "socket.io-client";
import { isDeepStrictEqual } from "node:util";

const WAIT_MS = 5000;
const RUN_MAX_MS = 50000;

const results = [];

// Client options and the Engine.IO transport each mode must end up on.
const MODES = {
  websocket: { options: { transports: ["websocket"] }, transport: "websocket" },
  default: { options: {}, transport: "websocket" },
  polling: { options: { upgrade: false }, transport: "polling" },
};
let mode = MODES.websocket;

function report(name, error) {
  results.push(error === null);
  console.log(error === null ? `PASS ${name}` : `FAIL ${name}: ${error}`);
}

function show(value) {
  if (Buffer.isBuffer(value)) return `<${value.length} bytes>`;
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

function open(url, options = {}) {
  // forceNew: every socket gets its own Engine.IO connection, so one check's
  // connection state cannot leak into another's.
  return io(url, {
    ...mode.options,
    reconnection: false,
    forceNew: true,
    timeout: WAIT_MS,
    ...options,
  });
}

function connected(socket, what) {
  return bounded(
    new Promise((resolve, reject) => {
      socket.once("connect", resolve);
      socket.once("connect_error", (err) => reject(new Error(`connect_error: ${err.message}`)));
    }),
    what,
  );
}

// One connection to `/` that queues every `msg` event it receives.
class Peer {
  static async open(url) {
    const peer = new Peer(open(url));
    await connected(peer.socket, "connect to /");
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
    return this.socket.timeout(WAIT_MS).emitWithAck(event, data);
  }

  nextMsg() {
    if (this.queued.length > 0) return Promise.resolve(this.queued.shift());
    return bounded(new Promise((resolve) => this.waiting.push(resolve)), "a msg event");
  }

  close() {
    this.socket.disconnect();
  }
}

function expectOk(ack, what) {
  if (ack === null || typeof ack !== "object" || ack.ok !== true) {
    throw new Error(`${what}: expected an ack with ok:true, got ${show(ack)}`);
  }
  return ack;
}

function expectError(ack, code, what) {
  if (ack?.ok !== false || ack?.error?.code !== code) {
    throw new Error(`${what}: expected error code "${code}", got ${show(ack)}`);
  }
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
    if (!peer.socket.connected || !peer.socket.id) throw new Error("connected without an id");
    expectOk(await peer.call("ping", {}), "ping");
    // The transport the mode asks for is the one in use (after an upgrade,
    // when there is one).
    const engine = peer.socket.io.engine;
    if (engine.transport.name !== mode.transport) {
      await bounded(new Promise((resolve) => engine.once("upgrade", resolve)), "the upgrade");
    }
    if (engine.transport.name !== mode.transport) {
      throw new Error(`on transport ${engine.transport.name}, expected ${mode.transport}`);
    }
    expectOk(await peer.call("ping", {}), "ping on the final transport");
  });
}

async function checkControl(url, token) {
  const socket = open(`${url}/control`, { auth: { token } });
  try {
    await connected(socket, "connect to /control");
    const info = expectOk(
      await socket.timeout(WAIT_MS).emitWithAck("server.info", {}),
      "server.info",
    );
    if (typeof info.node_id !== "string" || info.node_id === "") {
      throw new Error(`server.info has no node_id: ${show(info)}`);
    }
  } finally {
    socket.disconnect();
  }
}

async function checkControlRefused(url, token) {
  const socket = open(`${url}/control`, { auth: { token: `${token}-wrong` } });
  try {
    const outcome = await bounded(
      new Promise((resolve) => {
        socket.once("connect", () => resolve(null));
        socket.once("connect_error", resolve);
      }),
      "connect_error on /control",
    );
    if (outcome === null) throw new Error("a wrong token was accepted");
    if (outcome.message !== "unauthorized") {
      throw new Error(`expected message "unauthorized", got "${outcome.message}"`);
    }
  } finally {
    socket.disconnect();
  }
}

async function checkPubSub(url) {
  await withPeers(url, 2, async (sub, pub) => {
    const sid = await subscribe(sub, "interop.*.x");
    expectOk(await pub.call("pub", { subject: "interop.a.x", data: { n: 1 } }), "pub interop.a.x");
    const msg = await sub.nextMsg();
    const want = { sid, subject: "interop.a.x", data: { n: 1 } };
    const got = { sid: msg?.sid, subject: msg?.subject, data: msg?.data };
    if (!isDeepStrictEqual(got, want)) {
      throw new Error(`expected msg ${show(want)}, got ${show(msg)}`);
    }
    // A subject the pattern does not match, then a barrier: the ping ack says
    // the pub was processed; the matching sentinel must be the next delivery.
    expectOk(await pub.call("pub", { subject: "interop.a.y", data: 2 }), "pub interop.a.y");
    expectOk(await pub.call("ping", {}), "ping");
    expectOk(await pub.call("pub", { subject: "interop.end.x", data: 3 }), "pub interop.end.x");
    const next = await sub.nextMsg();
    if (next?.subject !== "interop.end.x") {
      throw new Error(`expected the sentinel interop.end.x, got ${show(next)}`);
    }
  });
}

async function checkRequestReply(url) {
  await withPeers(url, 2, async (responder, requester) => {
    let seenReply;
    responder.socket.on("msg", (msg) => {
      seenReply = msg?.reply;
      if (seenReply) responder.socket.emit("pub", { subject: seenReply, data: msg.data });
    });
    await subscribe(responder, "svc.echo");
    const ack = expectOk(
      await requester.call("request", { subject: "svc.echo", data: "hi", timeout_ms: 2000 }),
      "request",
    );
    if (ack.data !== "hi" || typeof ack.subject !== "string" || ack.subject !== seenReply) {
      throw new Error(`expected data "hi" on subject ${show(seenReply)}, got ${show(ack)}`);
    }
  });
}

async function checkErrorAcks(url) {
  await withPeers(url, 1, async (peer) => {
    expectError(await peer.call("sub", { subject: "bad..subject" }), "bad_subject", "sub bad..subject");
    expectError(
      await peer.call("request", { subject: "interop.nobody.home", data: 1, timeout_ms: 2000 }),
      "no_responders",
      "request to a subject with no subscriber",
    );
    expectOk(await peer.call("ping", {}), "ping after the errors");
  });
}

async function checkBinary(url) {
  await withPeers(url, 2, async (sub, pub) => {
    const payload = Buffer.concat([Buffer.from([...Array(256).keys()]), Buffer.from("\0end")]);
    const sid = await subscribe(sub, "interop.bin");
    expectOk(await pub.call("pub", { subject: "interop.bin", data: payload }), "pub bytes");
    const msg = await sub.nextMsg();
    if (msg?.sid !== sid) throw new Error(`expected a msg for sid ${sid}, got ${show(msg)}`);
    const data = msg.data;
    const isBinary = Buffer.isBuffer(data) || data instanceof ArrayBuffer || ArrayBuffer.isView(data);
    if (!isBinary) throw new Error(`expected binary data, got ${show(data)}`);
    const got = Buffer.from(data instanceof ArrayBuffer ? data : data.buffer.slice(
      data.byteOffset, data.byteOffset + data.byteLength));
    if (!got.equals(payload)) {
      throw new Error(`expected ${payload.length} equal bytes, got ${got.length} bytes`);
    }
  });
}

// The bytes of a binary value as socket.io-client hands it over (a Buffer
// in Node, or an ArrayBuffer / typed array), or null if it is not binary.
function bytesOf(data) {
  if (Buffer.isBuffer(data)) return data;
  if (data instanceof ArrayBuffer) return Buffer.from(data);
  if (ArrayBuffer.isView(data)) {
    return Buffer.from(data.buffer.slice(data.byteOffset, data.byteOffset + data.byteLength));
  }
  return null;
}

function sameBytes(got, want, what) {
  const b = bytesOf(got);
  if (b === null || !b.equals(want)) {
    throw new Error(`${what}: expected ${want.length} equal bytes, got ${show(got)}`);
  }
}

// Binary data in a stream: stored as bytes, back as bytes from stream.get,
// consumer.fetch (a BINARY_ACK beside JSON messages) and a push consumer.
async function checkStreamBinary(url) {
  await withPeers(url, 2, async (p, sub) => {
    const blob = Buffer.concat([Buffer.from([...Array(256).keys()]), Buffer.from("\xff\0")]);
    const small = Buffer.from([0, 1]);
    expectOk(await p.call("stream.create", { name: "NODEB", subjects: ["nodeb.>"],
      max_msg_size: blob.length }), "stream.create");
    same(await p.call("pub", { subject: "nodeb.a", data: blob }),
      { ok: true, stream: "NODEB", seq: 1 }, "pub of bytes (a plain ack)");
    same(await p.call("pub", { subject: "nodeb.a", data: "json" }),
      { ok: true, stream: "NODEB", seq: 2 }, "pub of JSON");
    same(await p.call("pub", { subject: "nodeb.a", data: small }),
      { ok: true, stream: "NODEB", seq: 3 }, "pub of more bytes");
    expectError(await p.call("pub", { subject: "nodeb.a", data: Buffer.concat([blob, small]) }),
      "payload_too_large", "max_msg_size counts the bytes");
    const got = expectOk(await p.call("stream.get", { name: "NODEB", seq: 1 }), "stream.get");
    sameBytes(got.message.data, blob, "stream.get data");
    expectOk(await p.call("consumer.create", { stream: "NODEB", name: "pull" }),
      "consumer.create");
    const f = expectOk(await p.call("consumer.fetch", { stream: "NODEB", consumer: "pull",
      batch: 10, no_wait: true }), "consumer.fetch");
    same(f.messages.map((m) => m.seq), [1, 2, 3], "fetched seqs");
    sameBytes(f.messages[0].data, blob, "fetched data 1");
    same(f.messages[1].data, "json", "fetched data 2");
    sameBytes(f.messages[2].data, small, "fetched data 3");
    expectOk(await sub.call("sub", { subject: "nodeb-push", sid: "b" }), "sub");
    expectOk(await p.call("consumer.create", { stream: "NODEB", name: "push",
      deliver_subject: "nodeb-push", ack_policy: "none" }), "push consumer.create");
    for (const [seq, want] of [[1, blob], [2, "json"], [3, small]]) {
      const msg = await sub.nextMsg();
      const { data, ...rest } = msg ?? {};
      same(rest, { sid: "b", subject: "nodeb.a", stream: "NODEB", consumer: "push", seq,
        delivered: 1 }, `push delivery ${seq}`);
      if (typeof want === "string") same(data, want, `push delivery ${seq} data`);
      else sameBytes(data, want, `push delivery ${seq} data`);
    }
    same(await p.call("stream.delete", { name: "NODEB" }), { ok: true }, "stream.delete");
  });
}

function same(got, want, what) {
  if (!isDeepStrictEqual(got, want)) {
    throw new Error(`${what}: expected ${show(want)}, got ${show(got)}`);
  }
}

function keysOf(obj) {
  return obj !== null && typeof obj === "object" ? Object.keys(obj).sort() : obj;
}

// Streams (contract section 5) as socket.io-client sees them: the exact
// shape of the acks of create, publish, get, consumer create/info/fetch,
// ack, purge and delete, and of a push delivery.
async function checkStreams(url) {
  await withPeers(url, 2, async (p, sub) => {
    const created = expectOk(await p.call("stream.create", {
      name: "NODES", subjects: ["nodes.>"] }), "stream.create");
    same(keysOf(created), ["ok", "stream"], "stream.create ack");
    same(created.stream.state, { messages: 0, bytes: 0, first_seq: 0, last_seq: 0,
      consumer_count: 0 }, "a new stream's state");
    same(created.stream.config, { name: "NODES", subjects: ["nodes.>"], retention: "limits",
      max_msgs: 0, max_bytes: 0, max_age_ms: 0, max_msg_size: 0, discard: "old",
      duplicate_window_ms: 0 }, "stream defaults");
    const data = { z: 1, a: [true, null, "s"] };
    const headers = { "Msg-Id": "n1", Trace: "x" };
    same(await p.call("pub", { subject: "nodes.a", data, headers }),
      { ok: true, stream: "NODES", seq: 1 }, "pub ack");
    const got = expectOk(await p.call("stream.get", { name: "NODES", seq: 1 }), "stream.get");
    same(keysOf(got.message), ["data", "headers", "seq", "subject", "time"], "stream.get keys");
    same([got.message.seq, got.message.subject, got.message.data, got.message.headers],
      [1, "nodes.a", data, headers], "stream.get message");
    same(Object.keys(got.message.data), ["z", "a"], "data keeps its key order");
    if (!Number.isInteger(got.message.time) || Math.abs(Date.now() - got.message.time) > 60000) {
      throw new Error(`time is not ms since the epoch: ${show(got.message.time)}`);
    }
    const c = expectOk(await p.call("consumer.create", { stream: "NODES", name: "pull" }),
      "consumer.create");
    same(c.consumer.config, { name: "pull", deliver_policy: "all", ack_policy: "explicit",
      ack_wait_ms: 30000, max_deliver: 0, max_ack_pending: 1000 }, "consumer defaults");
    const f = expectOk(await p.call("consumer.fetch", { stream: "NODES", consumer: "pull" }),
      "consumer.fetch");
    same(keysOf(f), ["messages", "ok"], "consumer.fetch ack");
    same(f.messages.map((m) => [keysOf(m), m.seq, m.data, m.headers, m.delivered]),
      [[["data", "delivered", "headers", "seq", "subject", "time"], 1, data, headers, 1]],
      "fetched messages");
    same(await p.call("ack", { stream: "NODES", consumer: "pull", seq: 1 }), { ok: true }, "ack");
    const info = expectOk(await p.call("consumer.info", { stream: "NODES", name: "pull" }),
      "consumer.info").consumer;
    same([info.delivered, info.ack_floor, info.num_pending, info.num_ack_pending,
      info.num_redelivered], [{ stream_seq: 1, consumer_seq: 1 },
      { stream_seq: 1, consumer_seq: 1 }, 0, 0, 0], "consumer.info numbers");
    same(await p.call("consumer.fetch", { stream: "NODES", consumer: "pull", no_wait: true }),
      { ok: true, messages: [] }, "no_wait with nothing pending");
    expectOk(await sub.call("sub", { subject: "nodes-push", sid: "own" }), "sub");
    expectOk(await p.call("consumer.create", { stream: "NODES", name: "push",
      deliver_subject: "nodes-push", ack_policy: "none" }), "push consumer.create");
    same(await sub.nextMsg(), { sid: "own", subject: "nodes.a", data, headers, stream: "NODES",
      consumer: "push", seq: 1, delivered: 1 }, "a push delivery");
    same(await p.call("stream.purge", { name: "NODES" }), { ok: true, purged: 1 }, "purge");
    const st = expectOk(await p.call("stream.info", { name: "NODES" }), "stream.info").stream.state;
    same(st, { messages: 0, bytes: 0, first_seq: 2, last_seq: 1, consumer_count: 2 },
      "state after a purge");
    same(await p.call("stream.delete", { name: "NODES" }), { ok: true }, "stream.delete");
  });
}

// Key-value buckets (contract section 14): create, put (JSON and bytes),
// get, compare-and-set, delete and history, and a watch with its
// caught_up marker and live deliveries, bytes included.
async function checkKv(url) {
  await withPeers(url, 2, async (p, w) => {
    const created = expectOk(await p.call("kv.create", { bucket: "nodekv", history: 2 }),
      "kv.create");
    same(created.bucket.state, { values: 0, bytes: 0, revision: 0 }, "a new bucket's state");
    same(created.bucket.config.history, 2, "history");
    same(await p.call("kv.put", { bucket: "nodekv", key: "a.b", value: { n: 1 } }),
      { ok: true, revision: 1 }, "kv.put");
    const blob = Buffer.from([0, 255, 1, 254]);
    same(await p.call("kv.put", { bucket: "nodekv", key: "bin", value: blob }),
      { ok: true, revision: 2 }, "kv.put of bytes");
    const got = expectOk(await p.call("kv.get", { bucket: "nodekv", key: "bin" }), "kv.get");
    same(keysOf(got.entry), ["key", "op", "revision", "time", "value"], "entry keys");
    sameBytes(got.entry.value, blob, "kv.get of bytes");
    const stale = await p.call("kv.put", { bucket: "nodekv", key: "a.b", value: 2, revision: 7 });
    expectError(stale, "wrong_revision", "a stale compare-and-set");
    same(stale.error.revision, 1, "error.revision");
    same(await p.call("kv.delete", { bucket: "nodekv", key: "a.b", revision: 1 }),
      { ok: true, revision: 3 }, "kv.delete");
    expectError(await p.call("kv.get", { bucket: "nodekv", key: "a.b" }), "not_found",
      "a deleted key");
    const h = expectOk(await p.call("kv.history", { bucket: "nodekv", key: "a.b" }), "history");
    same(h.entries.map((e) => [e.revision, e.op]), [[1, "put"], [3, "delete"]], "history");
    const watch = expectOk(await w.call("kv.watch", { bucket: "nodekv" }), "kv.watch");
    // Each key's latest write, in revision order.
    const first = await w.nextMsg();
    same([first.sid, first.key, first.revision, first.op], [watch.sid, "bin", 2, "put"],
      "a watch's first value");
    sameBytes(first.value, blob, "a watch's starting bytes");
    const second = await w.nextMsg();
    same(keysOf(second), ["bucket", "key", "op", "revision", "sid", "time"],
      "a delete marker has no value");
    same([second.key, second.revision, second.op], ["a.b", 3, "delete"], "a watch's second");
    same(await w.nextMsg(), { sid: watch.sid, bucket: "nodekv", caught_up: true }, "caught_up");
    expectOk(await p.call("kv.put", { bucket: "nodekv", key: "a.b", value: "again" }), "put");
    expectOk(await p.call("kv.put", { bucket: "nodekv", key: "bin", value: blob }), "put");
    const live = await w.nextMsg();
    same([live.key, live.value, live.revision, live.op], ["a.b", "again", 4, "put"],
      "a live delivery");
    sameBytes((await w.nextMsg()).value, blob, "a live delivery of bytes");
    same(await w.call("unsub", { sid: watch.sid }), { ok: true }, "unsub of a watch");
    same(await p.call("kv.delete_bucket", { bucket: "nodekv" }), { ok: true }, "delete_bucket");
  });
}

async function main() {
  const [url, token, modeName = "websocket"] = process.argv.slice(2);
  if (!url || token === undefined || !MODES[modeName]) {
    console.error("usage: node client.mjs URL CONTROL_TOKEN [websocket|default|polling]");
    return 2;
  }
  mode = MODES[modeName];
  const watchdog = setTimeout(() => {
    console.log(`FAIL watchdog: run exceeded ${RUN_MAX_MS / 1000} s`);
    process.exit(3);
  }, RUN_MAX_MS);
  await check("connect", () => checkConnect(url));
  await check("control_info", () => checkControl(url, token));
  await check("control_unauthorized", () => checkControlRefused(url, token));
  await check("pubsub_wildcard", () => checkPubSub(url));
  await check("request_reply", () => checkRequestReply(url));
  await check("error_acks", () => checkErrorAcks(url));
  await check("binary", () => checkBinary(url));
  await check("streams", () => checkStreams(url));
  await check("stream_binary", () => checkStreamBinary(url));
  await check("kv", () => checkKv(url));
  clearTimeout(watchdog);
  const failed = results.filter((ok) => !ok).length;
  console.log(`summary: ${results.length - failed} of ${results.length} checks passed`);
  return failed === 0 ? 0 : 1;
}

// Exit explicitly: a socket left half-open by a misbehaving server must not
// keep the event loop (and so the test) alive.
main().then(
  (code) => process.exit(code),
  (err) => {
    console.log(`FAIL internal: ${err?.stack ?? err}`);
    process.exit(1);
  },
);
