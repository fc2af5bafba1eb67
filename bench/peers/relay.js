// A plain socket.io 4.x server speaking gombus' core messaging events, as
// the benchmark's third peer: `sub` (exact subjects, `*` and `>`, `queue`
// groups shared round-robin, `sid`), `unsub`, `pub` (`reply`), `request`
// (an inbox per request; the first reply becomes the ack), `ping`, and the
// `msg` delivery. No streams, clustering or limits: it shows what a stock
// socket.io server costs for the same client work.
//
//   HOST=127.0.0.1 PORT=4500 node relay.js
'use strict';

const http = require('http');
const { Server } = require('socket.io');

const host = process.env.HOST || '127.0.0.1';
const port = Number(process.env.PORT || 4500);

// Exact subjects: subject -> Set of subscriptions. Patterns with
// wildcards: a list, matched token by token.
const exact = new Map();
const patterns = new Set();
// Queue name -> rotating counter.
const turns = new Map();
let inboxSeq = 0;
const run = Math.random().toString(16).slice(2, 10);
// Inbox subject -> pending request's ack.
const waiting = new Map();

function matches(pattern, subject) {
  const p = pattern.split('.');
  const s = subject.split('.');
  for (let i = 0; i < p.length; i++) {
    if (p[i] === '>') return s.length > i;
    if (i >= s.length || (p[i] !== '*' && p[i] !== s[i])) return false;
  }
  return p.length === s.length;
}

function goodSubject(subject, wildcardsOk) {
  if (typeof subject !== 'string' || subject.length === 0 || subject.length > 256) return false;
  const toks = subject.split('.');
  return toks.every((t, i) => {
    if (t.length === 0 || /\s/.test(t)) return false;
    if (t === '*' || t === '>') return wildcardsOk && (t === '*' || i === toks.length - 1);
    return !t.includes('*') && !t.includes('>');
  });
}

function subscribersOf(subject) {
  const out = [];
  const set = exact.get(subject);
  if (set) for (const s of set) out.push(s);
  for (const s of patterns) if (matches(s.subject, subject)) out.push(s);
  return out;
}

// Delivers to every plain subscriber and one member per queue group.
function deliver(subject, data, reply) {
  const subs = subscribersOf(subject);
  const groups = new Map();
  let count = 0;
  for (const s of subs) {
    if (s.queue) {
      if (!groups.has(s.queue)) groups.set(s.queue, []);
      groups.get(s.queue).push(s);
    } else {
      send(s, subject, data, reply);
      count++;
    }
  }
  for (const [name, members] of groups) {
    const turn = turns.get(name) || 0;
    turns.set(name, turn + 1);
    send(members[turn % members.length], subject, data, reply);
    count++;
  }
  return count;
}

function send(s, subject, data, reply) {
  const m = { sid: s.sid, subject, data: data === undefined ? null : data };
  if (reply !== undefined) m.reply = reply;
  s.socket.emit('msg', m);
}

function refuse(ack, code, message) {
  if (typeof ack === 'function') ack({ ok: false, error: { code, message } });
}

const server = http.createServer();
const io = new Server(server, {
  perMessageDeflate: false,
  httpCompression: false,
  serveClient: false,
});

io.on('connection', (socket) => {
  const mine = new Map();
  let nextSid = 1;

  function remove(sid) {
    const s = mine.get(sid);
    if (!s) return false;
    mine.delete(sid);
    if (s.wild) patterns.delete(s);
    else {
      const set = exact.get(s.subject);
      set.delete(s);
      if (set.size === 0) exact.delete(s.subject);
    }
    return true;
  }

  socket.on('sub', (arg, ack) => {
    if (!arg || !goodSubject(arg.subject, true)) return refuse(ack, 'bad_subject', 'bad subject');
    let sid = arg.sid === undefined ? undefined : String(arg.sid);
    if (sid === undefined) {
      while (mine.has('s' + nextSid)) nextSid++;
      sid = 's' + nextSid++;
    } else if (mine.has(sid)) return refuse(ack, 'bad_request', 'sid in use');
    const s = { socket, sid, subject: arg.subject, queue: arg.queue || null,
      wild: arg.subject.includes('*') || arg.subject.includes('>') };
    mine.set(sid, s);
    if (s.wild) patterns.add(s);
    else {
      if (!exact.has(s.subject)) exact.set(s.subject, new Set());
      exact.get(s.subject).add(s);
    }
    if (typeof ack === 'function') ack({ ok: true, sid });
  });

  socket.on('unsub', (arg, ack) => {
    if (!arg || !remove(String(arg.sid))) return refuse(ack, 'not_found', 'no such subscription');
    if (typeof ack === 'function') ack({ ok: true });
  });

  socket.on('pub', (arg, ack) => {
    if (!arg || !goodSubject(arg.subject, false)) return refuse(ack, 'bad_subject', 'bad subject');
    const w = waiting.get(arg.subject);
    if (w) {
      waiting.delete(arg.subject);
      clearTimeout(w.timer);
      w.ack({ ok: true, subject: arg.subject, data: arg.data === undefined ? null : arg.data });
    }
    deliver(arg.subject, arg.data, arg.reply);
    if (typeof ack === 'function') ack({ ok: true });
  });

  socket.on('request', (arg, ack) => {
    if (typeof ack !== 'function') return;
    if (!arg || !goodSubject(arg.subject, false)) return refuse(ack, 'bad_subject', 'bad subject');
    const inbox = `_INBOX.relay.${run}.${++inboxSeq}`;
    const ms = Math.min(Math.max(Number(arg.timeout_ms) || 5000, 1), 300000);
    const timer = setTimeout(() => {
      waiting.delete(inbox);
      refuse(ack, 'timeout', 'no reply in time');
    }, ms);
    waiting.set(inbox, { ack, timer });
    if (deliver(arg.subject, arg.data, inbox) === 0) {
      waiting.delete(inbox);
      clearTimeout(timer);
      refuse(ack, 'no_responders', 'no subscriber');
    }
  });

  socket.on('ping', (_arg, ack) => {
    if (typeof ack === 'function') ack({ ok: true });
  });

  socket.on('disconnect', () => {
    for (const sid of [...mine.keys()]) remove(sid);
  });
});

server.listen(port, host, () => {
  console.log(`relay listening on ${host}:${port}`);
});

process.on('SIGTERM', () => process.exit(0));
