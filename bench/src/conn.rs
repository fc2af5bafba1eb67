//! One client connection, whichever protocol: the same calls drive a
//! Socket.IO peer (gombus, the relay) and a NATS peer, so every peer gets
//! the same client work and only the wire format differs.

use std::io;
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use crate::nats::Nats;
use crate::sio::Sio;

/// What a connection hands to a workload.
pub enum Event<'a> {
    /// A delivery: the body, where to reply (requests; NATS: also a
    /// JetStream delivery's metadata and flow control), and `raw`: the
    /// whole Socket.IO frame, or the NATS headers and body.
    Msg {
        data: &'a [u8],
        reply: Option<&'a [u8]>,
        raw: &'a [u8],
    },
    /// The answer to an acked publish or a request with this id: `data` is
    /// the reply's body, `raw` the whole answer (ack JSON or NATS payload).
    Ack {
        id: u64,
        data: &'a [u8],
        raw: &'a [u8],
    },
    /// A barrier (`ping` ack; NATS PONG) came back.
    Pong,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    Sio,
    Nats,
    /// NATS over WebSocket.
    NatsWs,
}

impl Proto {
    pub fn name(self) -> &'static str {
        match self {
            Proto::Sio => "sio",
            Proto::Nats => "nats",
            Proto::NatsWs => "nats-ws",
        }
    }
}

pub fn fail(msg: impl Into<String>) -> io::Error {
    io::Error::other(msg.into())
}

/// Whether an error is a read timeout (the caller decides about stalls).
pub fn timed_out(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// A TCP connection with Nagle off and bounded reads and writes.
pub fn tcp(addr: &str, timeout: Duration) -> io::Result<TcpStream> {
    let sa = addr
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| fail(format!("no address for {addr}")))?;
    let s = TcpStream::connect_timeout(&sa, timeout)?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    Ok(s)
}

/// A random number from the kernel (inbox names, nothing secret).
pub fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        let _ = io::Read::read_exact(&mut f, &mut b);
    }
    u64::from_ne_bytes(b) ^ u64::from(std::process::id())
}

pub enum Conn {
    Sio(Box<Sio>),
    Nats(Nats),
}

impl Conn {
    pub fn connect(proto: Proto, addr: &str, small: bool) -> io::Result<Conn> {
        let t = Duration::from_secs(10);
        Ok(match proto {
            Proto::Sio => Conn::Sio(Box::new(Sio::connect(addr, small, t)?)),
            Proto::Nats => Conn::Nats(Nats::connect(addr, false, small, t)?),
            Proto::NatsWs => Conn::Nats(Nats::connect(addr, true, small, t)?),
        })
    }

    /// Subscribes and waits until the server confirms it (`sub` ack; SUB
    /// then PING/PONG).
    pub fn subscribe(&mut self, subject: &str, queue: Option<&str>, sid: u64) -> io::Result<()> {
        match self {
            Conn::Sio(c) => {
                let q = queue
                    .map(|q| format!(",\"queue\":\"{q}\""))
                    .unwrap_or_default();
                let ack = c.call(sid, "sub", &format!("{{\"subject\":\"{subject}\"{q}}}"))?;
                if !ack.contains("\"ok\":true") {
                    return Err(fail(format!("sub {subject} refused: {ack}")));
                }
                Ok(())
            }
            Conn::Nats(c) => {
                c.sub(subject, queue, sid);
                c.barrier()
            }
        }
    }

    /// A fire-and-forget publish (buffered until [`Conn::flush`]).
    pub fn publish(&mut self, subject: &[u8], data: &[u8]) -> io::Result<()> {
        match self {
            Conn::Sio(c) => c.publish(subject, data, None),
            Conn::Nats(c) => {
                c.publish(
                    std::str::from_utf8(subject).map_err(|_| fail("subject is not UTF-8"))?,
                    None,
                    None,
                    data,
                );
                Ok(())
            }
        }
    }

    /// A publish whose answer comes back as `Event::Ack { id }`: the stream
    /// ack (Socket.IO ack; NATS PubAck on the inbox).
    pub fn publish_acked(&mut self, subject: &str, data: &[u8], id: u64) -> io::Result<()> {
        match self {
            Conn::Sio(c) => c.publish(subject.as_bytes(), data, Some(id)),
            Conn::Nats(c) => {
                c.publish(subject, None, Some(id), data);
                Ok(())
            }
        }
    }

    /// A request answered as `Event::Ack { id }` (Socket.IO `request`, whose
    /// inbox the server makes; NATS PUB with a reply on our inbox).
    pub fn request(&mut self, subject: &str, data: &[u8], id: u64) -> io::Result<()> {
        match self {
            Conn::Sio(c) => {
                let body = std::str::from_utf8(data).map_err(|_| fail("body is not UTF-8"))?;
                c.emit(
                    Some(id),
                    "request",
                    &format!(
                        "{{\"subject\":\"{subject}\",\"data\":\"{body}\",\"timeout_ms\":5000}}"
                    ),
                )
            }
            Conn::Nats(c) => {
                c.publish(subject, None, Some(id), data);
                Ok(())
            }
        }
    }

    /// Answers a delivery that named a reply subject.
    pub fn respond(&mut self, reply: &[u8], data: &[u8]) -> io::Result<()> {
        match self {
            Conn::Sio(c) => c.publish(reply, data, None),
            Conn::Nats(c) => {
                let r = std::str::from_utf8(reply).map_err(|_| fail("reply is not UTF-8"))?;
                c.publish(r, None, None, data);
                Ok(())
            }
        }
    }

    /// Creates stream `name` over `subject` with `replicas` copies,
    /// accepting one that already exists.
    pub fn create_stream(&mut self, name: &str, subject: &str, replicas: u32) -> io::Result<()> {
        let ack = match self {
            Conn::Sio(_) => {
                let r = if replicas > 1 {
                    format!(",\"replicas\":{replicas}")
                } else {
                    String::new()
                };
                self.api(
                    "stream.create",
                    &format!("{{\"name\":\"{name}\",\"subjects\":[\"{subject}\"]{r}}}"),
                )?
            }
            Conn::Nats(_) => self
                .api(
                    &format!("$JS.API.STREAM.CREATE.{name}"),
                    &format!(
                        "{{\"name\":\"{name}\",\"subjects\":[\"{subject}\"],\"storage\":\"file\",\"num_replicas\":{replicas}}}"
                    ),
                )
                .map_err(|e| {
                    if timed_out(&e) {
                        fail("no answer to the JetStream stream create (is JetStream on?)")
                    } else {
                        e
                    }
                })?,
        };
        // Socket.IO: `exists`; JetStream 10058: a stream of that name exists.
        let fine = match self {
            Conn::Sio(_) => ack.contains("\"ok\":true") || ack.contains("\"code\":\"exists\""),
            Conn::Nats(_) => !ack.contains("\"error\"") || ack.contains("10058"),
        };
        if fine {
            Ok(())
        } else {
            Err(fail(format!("stream create refused: {ack}")))
        }
    }

    /// Creates key-value bucket `bucket` with history 1 (Socket.IO
    /// `kv.create`; NATS: stream `KV_<bucket>` on `$KV.<bucket>.>` as
    /// JetStream's own key-value buckets are made, with direct gets),
    /// accepting one that already exists.
    pub fn create_bucket(&mut self, bucket: &str) -> io::Result<()> {
        let ack = match self {
            Conn::Sio(_) => self.api("kv.create", &format!("{{\"bucket\":\"{bucket}\"}}"))?,
            Conn::Nats(_) => self.api(
                &format!("$JS.API.STREAM.CREATE.KV_{bucket}"),
                &format!(
                    "{{\"name\":\"KV_{bucket}\",\"subjects\":[\"$KV.{bucket}.>\"],\"storage\":\"file\",\
                     \"num_replicas\":1,\"max_msgs_per_subject\":1,\"discard\":\"new\",\
                     \"allow_rollup_hdrs\":true,\"deny_delete\":true,\"allow_direct\":true}}"
                ),
            )?,
        };
        let fine = match self {
            Conn::Sio(_) => ack.contains("\"ok\":true") || ack.contains("\"code\":\"exists\""),
            // A server without direct gets leaves `allow_direct` out of
            // the config it answers with.
            Conn::Nats(_) => {
                (!ack.contains("\"error\"") || ack.contains("10058"))
                    && ack.contains("\"allow_direct\":true")
            }
        };
        if fine {
            Ok(())
        } else {
            Err(fail(format!("bucket create refused: {ack}")))
        }
    }

    /// A put of `value` to `key` answered as `Event::Ack { id }` (Socket.IO
    /// `kv.put`, the value a JSON string; NATS: a publish to
    /// `$KV.<bucket>.<key>`, answered by the JetStream PubAck).
    pub fn kv_put(&mut self, bucket: &str, key: &str, value: &[u8], id: u64) -> io::Result<()> {
        match self {
            Conn::Sio(c) => {
                let v = std::str::from_utf8(value).map_err(|_| fail("value is not UTF-8"))?;
                c.emit(
                    Some(id),
                    "kv.put",
                    &format!("{{\"bucket\":\"{bucket}\",\"key\":\"{key}\",\"value\":\"{v}\"}}"),
                )
            }
            Conn::Nats(c) => {
                c.publish(&format!("$KV.{bucket}.{key}"), None, Some(id), value);
                Ok(())
            }
        }
    }

    /// A get of `key`'s latest value answered as `Event::Ack { id }`
    /// (Socket.IO `kv.get`; NATS: a JetStream direct get of the last
    /// message on `$KV.<bucket>.<key>`).
    pub fn kv_get(&mut self, bucket: &str, key: &str, id: u64) -> io::Result<()> {
        match self {
            Conn::Sio(c) => c.emit(
                Some(id),
                "kv.get",
                &format!("{{\"bucket\":\"{bucket}\",\"key\":\"{key}\"}}"),
            ),
            Conn::Nats(c) => {
                c.publish(
                    &format!("$JS.API.DIRECT.GET.KV_{bucket}.$KV.{bucket}.{key}"),
                    None,
                    Some(id),
                    b"",
                );
                Ok(())
            }
        }
    }

    /// Watches bucket `bucket` for new writes only, and returns once the
    /// watch is in place: Socket.IO `kv.watch` with `updates_only` (its
    /// ack, then its `caught_up` delivery); NATS: what a JetStream
    /// key-value watcher is, an ordered push consumer on `KV_<bucket>`
    /// (deliver policy `new`, no acks, flow control and idle heartbeats)
    /// delivering to a subject of this connection's (subscribed first).
    /// Deliveries then come as `Event::Msg`, read by
    /// [`crate::work::kv_watched`].
    pub fn kv_watch(&mut self, bucket: &str) -> io::Result<()> {
        let arg = format!("{{\"bucket\":\"{bucket}\",\"updates_only\":true}}");
        match self {
            Conn::Sio(_) => {
                let ack = self.api("kv.watch", &arg)?;
                if !ack.contains("\"ok\":true") {
                    return Err(fail(format!("kv.watch refused: {ack}")));
                }
                loop {
                    if let Event::Msg { raw, .. } = self.next()? {
                        if memchr::memmem::find(raw, b"\"caught_up\":true").is_some() {
                            return Ok(());
                        }
                        return Err(fail(format!(
                            "a watch of new writes only sent {} before caught_up",
                            String::from_utf8_lossy(raw)
                        )));
                    }
                }
            }
            Conn::Nats(c) => {
                let deliver = format!("_WATCH.{:016x}", random_u64());
                c.sub(&deliver, None, 2);
                let stream = format!("KV_{bucket}");
                let ack = self.api(
                    &format!("$JS.API.CONSUMER.CREATE.{stream}"),
                    &format!(
                        "{{\"stream_name\":\"{stream}\",\"config\":{{\"deliver_subject\":\"{deliver}\",\
                         \"deliver_policy\":\"new\",\"ack_policy\":\"none\",\"max_deliver\":1,\
                         \"replay_policy\":\"instant\",\"flow_control\":true,\"idle_heartbeat\":5000000000,\
                         \"headers_only\":false,\"filter_subject\":\"$KV.{bucket}.>\",\
                         \"mem_storage\":true,\"num_replicas\":1}}}}"
                    ),
                )?;
                if ack.contains("\"error\"") {
                    return Err(fail(format!("watcher consumer create refused: {ack}")));
                }
                Ok(())
            }
        }
    }

    /// Blocking (false) or not (true): a read with nothing to read then
    /// fails at once as a timeout.
    pub fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        match self {
            Conn::Sio(c) => c.socket().set_nonblocking(on),
            Conn::Nats(c) => c.socket().set_nonblocking(on),
        }
    }

    /// One API call answered on its own: a Socket.IO event with an ack id
    /// (`what` is the event), or a NATS request on `what` answered on this
    /// connection's inbox (subscribed here). Returns the answer's text.
    /// A read timeout while waiting comes back as the error.
    pub fn api(&mut self, what: &str, arg: &str) -> io::Result<String> {
        const API_ID: u64 = 1 << 40;
        match self {
            Conn::Sio(c) => c.call(API_ID, what, arg),
            Conn::Nats(c) => {
                let inbox = c.inbox().to_string();
                c.sub(&format!("{inbox}.*"), None, 1);
                c.publish(what, None, Some(API_ID), arg.as_bytes());
                c.flush()?;
                loop {
                    if let Event::Ack { id, raw, .. } = c.next()? {
                        if id == API_ID {
                            return Ok(String::from_utf8_lossy(raw).into_owned());
                        }
                    }
                }
            }
        }
    }

    /// What a stream's information says about where it lives and what it
    /// holds (Socket.IO `stream.info`; NATS `$JS.API.STREAM.INFO`).
    pub fn stream_info(&mut self, name: &str) -> io::Result<StreamView> {
        let text = match self {
            Conn::Sio(_) => self.api("stream.info", &format!("{{\"name\":\"{name}\"}}"))?,
            Conn::Nats(_) => self.api(&format!("$JS.API.STREAM.INFO.{name}"), "")?,
        };
        // A Socket.IO ack's text starts with its id.
        let json = text.trim().trim_start_matches(|c: char| c.is_ascii_digit());
        let v: serde_json::Value = serde_json::from_str(json)
            .map_err(|e| fail(format!("stream info is not JSON ({e}): {text}")))?;
        // Socket.IO acks are an array of the answer.
        let v = v.get(0).cloned().unwrap_or(v);
        Ok(StreamView::of(&v))
    }
    /// Subscribes the inbox that acks and replies come to (NATS only; the
    /// Socket.IO server acks directly).
    pub fn listen_inbox(&mut self) -> io::Result<()> {
        if let Conn::Nats(c) = self {
            let inbox = c.inbox().to_string();
            c.sub(&format!("{inbox}.*"), None, 1);
            c.barrier()?;
        }
        Ok(())
    }

    pub fn next(&mut self) -> io::Result<Event<'_>> {
        match self {
            Conn::Sio(c) => c.next(),
            Conn::Nats(c) => c.next(),
        }
    }

    pub fn buffered(&self) -> usize {
        match self {
            Conn::Sio(c) => c.buffered(),
            Conn::Nats(c) => c.buffered(),
        }
    }

    pub fn flush(&mut self) -> io::Result<()> {
        match self {
            Conn::Sio(c) => c.flush(),
            Conn::Nats(c) => c.flush(),
        }
    }

    pub fn barrier(&mut self) -> io::Result<()> {
        match self {
            Conn::Sio(c) => c.barrier(),
            Conn::Nats(c) => c.barrier(),
        }
    }

    pub fn set_read_timeout(&self, t: Duration) -> io::Result<()> {
        match self {
            Conn::Sio(c) => c.socket().set_read_timeout(Some(t)),
            Conn::Nats(c) => c.socket().set_read_timeout(Some(t)),
        }
    }
}

/// A stream's placement and size as its information reports them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StreamView {
    /// The leading node as a 0-based index into the cluster's nodes (node
    /// id `n<i>` or Raft id `i` is index i-1); None while there is none.
    pub leader: Option<usize>,
    /// Members besides the leader.
    pub replicas: usize,
    /// Of those, how many the information calls current.
    pub current: usize,
    pub messages: Option<u64>,
    /// The error the answer carried, if any.
    pub error: Option<String>,
}

impl StreamView {
    /// Reads a gombus `stream.info` answer (`{ok, stream:{state, cluster}}`)
    /// or a JetStream one (`{state, cluster}`, or `{error}`).
    pub fn of(v: &serde_json::Value) -> StreamView {
        let body = v.get("stream").unwrap_or(v);
        // gombus puts `cluster` next to `stream` in the answer; a list
        // entry (and JetStream) has it beside `state`.
        let cluster = v.get("cluster").unwrap_or(&body["cluster"]);
        let index = |n: &serde_json::Value| -> Option<usize> {
            let k = match n {
                serde_json::Value::Number(k) => k.as_u64()?,
                serde_json::Value::String(s) => s.trim_start_matches('n').parse().ok()?,
                _ => return None,
            };
            k.checked_sub(1).map(|k| k as usize)
        };
        let replicas = cluster["replicas"].as_array().cloned().unwrap_or_default();
        let error =
            if v.get("ok") == Some(&serde_json::Value::Bool(false)) || v.get("error").is_some() {
                Some(
                    v.get("error")
                        .map(|e| e.to_string())
                        .unwrap_or_else(|| v.to_string()),
                )
            } else {
                None
            };
        StreamView {
            leader: index(&cluster["leader"]),
            replicas: replicas.len(),
            current: replicas
                .iter()
                .filter(|r| r["current"] == serde_json::Value::Bool(true))
                .count(),
            messages: body["state"]["messages"].as_u64(),
            error,
        }
    }
}
