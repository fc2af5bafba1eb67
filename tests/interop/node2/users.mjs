// Users and permissions (docs/PROTOCOL.md §11) with the unmodified
// socket.io-client 2.x (Engine.IO v3): it joins `/` without a CONNECT, so
// it names its user with `query: {token}` on the handshake.
//
// Usage: node users.mjs URL CONTROL_TOKEN [MODE]
//
// The broker runs with -users tests/users/users.json. One PASS/FAIL line
// per check, exit 1 if any failed; every wait is bounded.

import io from "socket.io-client";

const WAIT_MS = 5000;
const RUN_MAX_MS = 50000;
const MODES = { default: {}, polling: { transports: ["polling"] } };
let options = MODES.default;
const results = [];

function bounded(promise, what) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out waiting for ${what}`)), WAIT_MS);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

function open(url, token) {
  const query = token === undefined ? {} : { token };
  return io(url, { ...options, reconnection: false, forceNew: true, timeout: WAIT_MS, query });
}

function outcome(socket, what) {
  return bounded(
    new Promise((resolve) => {
      socket.once("connect", () => resolve("ok"));
      socket.once("error", (err) =>
        resolve(err === "unauthorized" || err?.message === "unauthorized" ? "refused" : `error ${err}`),
      );
      socket.once("connect_error", (err) => resolve(`connect_error ${err}`));
    }),
    what,
  );
}

function call(socket, event, arg) {
  return bounded(new Promise((resolve) => socket.emit(event, arg, resolve)), `ack of ${event}`);
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

async function checkRefused(url) {
  for (const token of [undefined, "nope"]) {
    const s = open(url, token);
    try {
      const got = await outcome(s, `connect with token ${token}`);
      if (got !== "refused") throw new Error(`token ${token}: ${got}`);
    } finally {
      s.close();
    }
  }
}

async function checkRights(url) {
  const s = open(url, "tok-billing");
  try {
    const got = await outcome(s, "connect as billing");
    if (got !== "ok") throw new Error(`connect as billing: ${got}`);
    const denied = await call(s, "sub", { subject: "billing.*" });
    if (denied?.error?.code !== "forbidden") throw new Error(`sub billing.*: ${JSON.stringify(denied)}`);
    const allowed = await call(s, "sub", { subject: "orders.>" });
    if (allowed?.ok !== true) throw new Error(`sub orders.>: ${JSON.stringify(allowed)}`);
    const pub = await call(s, "pub", { subject: "other.x", data: 1 });
    if (pub?.error?.code !== "forbidden") throw new Error(`pub other.x: ${JSON.stringify(pub)}`);
  } finally {
    s.close();
  }
}

async function main() {
  const [url, , modeName = "default"] = process.argv.slice(2);
  options = MODES[modeName];
  const watchdog = setTimeout(() => {
    console.log(`FAIL watchdog: run exceeded ${RUN_MAX_MS} ms`);
    process.exit(3);
  }, RUN_MAX_MS);
  await check("refused", () => checkRefused(url));
  await check("rights", () => checkRights(url));
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
