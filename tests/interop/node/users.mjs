// Users and permissions (docs/PROTOCOL.md §11) with the unmodified
// socket.io-client 4.x.
//
// Usage: node users.mjs URL CONTROL_TOKEN [MODE]
//
// The broker runs with -users tests/users/users.json; the tokens below are
// that file's. One PASS/FAIL line per check, exit 1 if any failed; every
// wait is bounded and a watchdog ends a run that hangs.

import { io } from "socket.io-client";

const WAIT_MS = 5000;
const RUN_MAX_MS = 50000;
const MODES = {
  websocket: { transports: ["websocket"] },
  default: {},
  polling: { upgrade: false },
};
let options = MODES.websocket;
const results = [];

function bounded(promise, what) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out waiting for ${what}`)), WAIT_MS);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

function open(url, auth) {
  return io(url, { ...options, reconnection: false, forceNew: true, timeout: WAIT_MS, auth });
}

class User {
  static async open(url, token) {
    const u = new User(open(url, { token }));
    await bounded(
      new Promise((resolve, reject) => {
        u.socket.once("connect", resolve);
        u.socket.once("connect_error", (e) => reject(new Error(`connect_error: ${e.message}`)));
      }),
      `connect as ${token}`,
    );
    return u;
  }
  constructor(socket) {
    this.socket = socket;
    this.msgs = [];
    this.waiters = [];
    socket.on("msg", (m) => {
      const w = this.waiters.shift();
      if (w) w(m);
      else this.msgs.push(m);
    });
  }
  call(event, arg) {
    return bounded(this.socket.emitWithAck(event, arg), `ack of ${event}`);
  }
  next() {
    if (this.msgs.length) return Promise.resolve(this.msgs.shift());
    return bounded(new Promise((resolve) => this.waiters.push(resolve)), "a msg");
  }
  close() {
    this.socket.disconnect();
  }
}

function expectCode(ack, code, what) {
  if (ack?.ok !== false || ack?.error?.code !== code) {
    throw new Error(`${what}: expected ${code}, got ${JSON.stringify(ack)}`);
  }
}

function expectOk(ack, what) {
  if (ack?.ok !== true) throw new Error(`${what}: expected ok, got ${JSON.stringify(ack)}`);
}

async function check(name, body) {
  try {
    await body();
    results.push(true);
    console.log(`PASS ${name}`);
  } catch (e) {
    results.push(false);
    console.log(`FAIL ${name}: ${e?.message ?? e}`);
  }
}

async function checkUnauthorized(url) {
  for (const auth of [{ token: "nope" }, undefined]) {
    const s = open(url, auth);
    const outcome = await bounded(
      new Promise((resolve) => {
        s.once("connect", () => resolve("admitted"));
        s.once("connect_error", (e) => resolve(e.message));
      }),
      "connect outcome",
    );
    s.disconnect();
    if (outcome !== "unauthorized") {
      throw new Error(`auth=${JSON.stringify(auth)}: ${outcome}`);
    }
  }
}

async function checkPublish(url) {
  const admin = await User.open(url, "tok-admin");
  const billing = await User.open(url, "tok-billing");
  try {
    expectOk(await admin.call("sub", { subject: "orders.>", sid: "o" }), "admin sub");
    expectCode(await billing.call("pub", { subject: "node.x", data: 1 }), "forbidden", "outside allow");
    expectCode(
      await billing.call("pub", { subject: "orders.internal.a", data: 1 }),
      "forbidden",
      "under deny",
    );
    expectCode(await billing.call("request", { subject: "node.x", data: 1 }), "forbidden", "request");
    billing.socket.emit("pub", { subject: "orders.internal.b", data: "dropped" });
    expectOk(await billing.call("pub", { subject: "orders.node", data: "ok" }), "allowed");
    const m = await admin.next();
    if (m.subject !== "orders.node") throw new Error(`first delivery: ${JSON.stringify(m)}`);
  } finally {
    admin.close();
    billing.close();
  }
}

async function checkSubscribe(url) {
  const admin = await User.open(url, "tok-admin");
  const billing = await User.open(url, "tok-billing");
  try {
    for (const p of ["billing.*", "orders.internal.>", ">", "*.new"]) {
      expectCode(await billing.call("sub", { subject: p }), "forbidden", p);
    }
    expectOk(await billing.call("sub", { subject: "orders.>", sid: "w" }), "orders.>");
    expectOk(await admin.call("pub", { subject: "orders.internal.x", data: 1 }), "pub");
    expectOk(await admin.call("pub", { subject: "orders.y", data: 2 }), "pub");
    const m = await billing.next();
    if (m.data !== 2) throw new Error(`the deny cut let through ${JSON.stringify(m)}`);
  } finally {
    admin.close();
    billing.close();
  }
}

async function checkResponses(url) {
  const admin = await User.open(url, "tok-admin");
  const service = await User.open(url, "tok-service");
  try {
    expectOk(await service.call("sub", { subject: "svc.node", sid: "s" }), "service sub");
    expectCode(await service.call("pub", { subject: "svc.node", data: 1 }), "forbidden", "publish");
    const answer = admin.call("request", { subject: "svc.node", data: "q", timeout_ms: 4000 });
    const req = await service.next();
    if (!req.reply) throw new Error(`no reply subject: ${JSON.stringify(req)}`);
    expectOk(await service.call("pub", { subject: req.reply, data: "a" }), "answer");
    expectCode(await service.call("pub", { subject: req.reply, data: "b" }), "forbidden", "again");
    const ack = await answer;
    if (ack?.data !== "a") throw new Error(`request ack: ${JSON.stringify(ack)}`);
  } finally {
    admin.close();
    service.close();
  }
}

async function checkStreams(url) {
  const admin = await User.open(url, "tok-admin");
  const billing = await User.open(url, "tok-billing");
  try {
    for (const name of ["ORDERS", "OTHER"]) {
      expectOk(
        await admin.call("stream.create", { name, subjects: [`node.stored.${name}.>`] }),
        `create ${name}`,
      );
    }
    expectCode(
      await billing.call("stream.create", { name: "X", subjects: ["x.>"] }),
      "forbidden",
      "create",
    );
    expectCode(await billing.call("stream.info", { name: "OTHER" }), "forbidden", "info OTHER");
    expectOk(await billing.call("stream.info", { name: "ORDERS" }), "info ORDERS");
    const list = await billing.call("stream.list", {});
    const names = list.streams.map((s) => s.config.name);
    if (JSON.stringify(names) !== '["ORDERS"]') throw new Error(`stream.list: ${names}`);
  } finally {
    admin.close();
    billing.close();
  }
}

async function main() {
  const [url, , mode = "websocket"] = process.argv.slice(2);
  options = MODES[mode];
  const watchdog = setTimeout(() => {
    console.log(`FAIL watchdog: run exceeded ${RUN_MAX_MS} ms`);
    process.exit(3);
  }, RUN_MAX_MS);
  await check("unauthorized", () => checkUnauthorized(url));
  await check("publish", () => checkPublish(url));
  await check("subscribe", () => checkSubscribe(url));
  await check("responses", () => checkResponses(url));
  await check("streams", () => checkStreams(url));
  clearTimeout(watchdog);
  const failed = results.filter((ok) => !ok).length;
  console.log(`summary: ${results.length - failed} of ${results.length} checks passed`);
  return failed === 0 ? 0 : 1;
}

main().then(
  (code) => process.exit(code),
  (err) => {
    console.log(`FAIL internal: ${err?.stack ?? err}`);
    process.exit(1);
  },
);
