//! A minimal HTTP/1.1 layer: request-head parsing with a bounded size, the
//! body length a request announces, keep-alive, and response encoding.
//! Pure: it sees bytes, never sockets.

/// The most bytes a request head (request line and headers) may take.
pub const HEAD_BYTES_MAX: usize = 8 * 1024;
/// The most headers a request may carry.
pub const HEADERS_MAX: usize = 64;

pub use crate::port::{Request, Response};

/// What the loop reads from a request head (the type is the port's).
impl Request {
    /// Whether the connection may carry another request after the answer
    /// (HTTP/1.1 unless `Connection: close`; HTTP/1.0 only when asked).
    pub fn keep_alive(&self) -> bool {
        if self.minor == 0 {
            self.header_has_token("Connection", "keep-alive")
        } else {
            !self.header_has_token("Connection", "close")
        }
    }

    /// The body length the head announces: `Ok(0)` without a body, an error
    /// for a body whose length is not given by one valid Content-Length.
    pub fn body_len(&self) -> Result<usize, HttpError> {
        if self.header("Transfer-Encoding").is_some() {
            return Err(HttpError::LengthRequired);
        }
        let mut lens = self
            .headers
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case("Content-Length"));
        let Some((_, v)) = lens.next() else {
            return Ok(0);
        };
        if lens.next().is_some() || v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
            return Err(HttpError::BadRequest);
        }
        v.parse::<usize>().map_err(|_| HttpError::PayloadTooLarge)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HttpError {
    /// 400: the head is not HTTP/1.x as we read it.
    BadRequest,
    /// 431: the head is over `HEAD_BYTES_MAX` or has too many headers.
    HeadTooLarge,
    /// 411: a body without a Content-Length (chunked is not spoken).
    LengthRequired,
    /// 413: a body over the bound.
    PayloadTooLarge,
}

impl HttpError {
    pub fn status(self) -> u16 {
        match self {
            HttpError::BadRequest => 400,
            HttpError::HeadTooLarge => 431,
            HttpError::LengthRequired => 411,
            HttpError::PayloadTooLarge => 413,
        }
    }
}

/// Parses a request head from the start of `buf`. `Ok(None)`: not all of it
/// has arrived yet. On success, also returns the bytes the head used.
pub fn parse_request(buf: &[u8]) -> Result<Option<(Request, usize)>, HttpError> {
    let Some(end) = find_head_end(buf) else {
        // A head with bare-LF line endings would never end: refuse it now
        // rather than at the idle cut.
        return if has_bare_lf(&buf[..buf.len().min(HEAD_BYTES_MAX + 1)]) {
            Err(HttpError::BadRequest)
        } else if buf.len() > HEAD_BYTES_MAX {
            Err(HttpError::HeadTooLarge)
        } else {
            Ok(None)
        };
    };
    if end > HEAD_BYTES_MAX {
        return Err(HttpError::HeadTooLarge);
    }
    if has_bare_lf(&buf[..end]) {
        return Err(HttpError::BadRequest);
    }
    let head = std::str::from_utf8(&buf[..end]).map_err(|_| HttpError::BadRequest)?;
    let mut lines = head.split("\r\n").filter(|l| !l.is_empty());
    let first = lines.next().ok_or(HttpError::BadRequest)?;
    let mut parts = first.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(HttpError::BadRequest);
    };
    let minor = match version {
        "HTTP/1.0" => 0,
        "HTTP/1.1" => 1,
        _ => return Err(HttpError::BadRequest),
    };
    if method.is_empty() || !method.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(HttpError::BadRequest);
    }
    if !target.starts_with('/') {
        return Err(HttpError::BadRequest);
    }
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let mut headers = Vec::new();
    for line in lines {
        if headers.len() == HEADERS_MAX {
            return Err(HttpError::HeadTooLarge);
        }
        let (k, v) = line.split_once(':').ok_or(HttpError::BadRequest)?;
        if k.is_empty() || k.contains(|c: char| c.is_whitespace()) {
            return Err(HttpError::BadRequest);
        }
        headers.push((k.to_string(), v.trim().to_string()));
    }
    let req = Request {
        method: method.to_string(),
        path: path.to_string(),
        query: query.to_string(),
        headers,
        minor,
    };
    Ok(Some((req, end)))
}

/// Whether a line ends in LF without the CR before it (RFC 9112 §2.2 lets
/// a server refuse that; the broker does, at once).
fn has_bare_lf(head: &[u8]) -> bool {
    head.iter()
        .enumerate()
        .any(|(i, &b)| b == b'\n' && (i == 0 || head[i - 1] != b'\r'))
}

/// Index just past the blank line that ends the head, if present.
fn find_head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|p| p + 4)
}

/// Encoding a response (the type is the port's); the connection closes
/// after it unless kept alive or upgraded.
impl Response {
    /// The status line, headers and body as bytes; the connection closes
    /// after it.
    pub fn encode(&self) -> Vec<u8> {
        self.encode_with(false)
    }

    /// As [`Response::encode`], saying whether the connection stays open.
    pub fn encode_with(&self, keep_alive: bool) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode_into(keep_alive, &mut out);
        out
    }

    /// Appends the encoded response to `out` (a large body is copied once,
    /// straight into the connection's buffer).
    pub fn encode_into(&self, keep_alive: bool, out: &mut Vec<u8>) {
        let connection = if keep_alive { "keep-alive" } else { "close" };
        let head = format!(
            "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: {connection}\r\n",
            self.status,
            reason(self.status),
            self.content_type,
            self.body.len()
        );
        out.reserve(head.len() + 2 + self.body.len());
        out.extend_from_slice(head.as_bytes());
        for (k, v) in &self.headers {
            out.extend_from_slice(format!("{k}: {v}\r\n").as_bytes());
        }
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(&self.body);
    }
}

pub fn reason(status: u16) -> &'static str {
    match status {
        101 => "Switching Protocols",
        200 => "OK",
        204 => "No Content",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        411 => "Length Required",
        413 => "Payload Too Large",
        426 => "Upgrade Required",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Unknown",
    }
}

/// The 101 answer to a WebSocket upgrade (RFC 6455 §4.2.2).
pub fn upgrade_response(accept: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {accept}\r\n\r\n"
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_request_cut_at_every_offset() {
        let raw = b"GET /socket.io/?EIO=4&transport=websocket HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: keep-alive, Upgrade\r\n\r\nrest";
        let head_len = raw.len() - 4;
        for cut in 0..head_len {
            assert_eq!(parse_request(&raw[..cut]), Ok(None), "cut at {cut}");
        }
        let (req, used) = parse_request(raw).unwrap().unwrap();
        assert_eq!(used, head_len);
        assert_eq!(req.method, "GET");
        assert_eq!(req.path, "/socket.io/");
        assert_eq!(req.query_param("EIO"), Some("4"));
        assert_eq!(req.query_param("transport"), Some("websocket"));
        assert_eq!(req.header("upgrade"), Some("websocket"));
        assert!(req.header_has_token("Connection", "upgrade"));
    }

    #[test]
    fn refuses_bad_and_huge_heads() {
        assert_eq!(
            parse_request(b"garbage\r\n\r\n"),
            Err(HttpError::BadRequest)
        );
        assert_eq!(
            parse_request(b"GET / HTTP/2\r\n\r\n"),
            Err(HttpError::BadRequest)
        );
        assert_eq!(
            parse_request(b"GET nopath HTTP/1.1\r\n\r\n"),
            Err(HttpError::BadRequest)
        );
        assert_eq!(
            parse_request(b"GET / HTTP/1.1\r\nno colon\r\n\r\n"),
            Err(HttpError::BadRequest)
        );
        assert_eq!(
            parse_request(b"GET / HTTP/1.1\r\n\xff: x\r\n\r\n"),
            Err(HttpError::BadRequest)
        );
        let big = vec![b'a'; HEAD_BYTES_MAX + 1];
        assert_eq!(parse_request(&big), Err(HttpError::HeadTooLarge));
        for bare in [
            &b"GET / HTTP/1.1\nHost: x\n\n"[..],
            b"GET / HTTP/1.1\nHost: x",
            b"GET / HTTP/1.1\r\nHost: x\n\r\n\r\n",
            b"\n",
        ] {
            assert_eq!(
                parse_request(bare).unwrap_err(),
                HttpError::BadRequest,
                "{bare:?}"
            );
        }
        let mut many = b"GET / HTTP/1.1\r\n".to_vec();
        for i in 0..=HEADERS_MAX {
            many.extend_from_slice(format!("h{i}: v\r\n").as_bytes());
        }
        many.extend_from_slice(b"\r\n");
        assert_eq!(parse_request(&many), Err(HttpError::HeadTooLarge));
    }

    #[test]
    fn reads_body_length_and_keep_alive() {
        let req = |raw: &[u8]| parse_request(raw).unwrap().unwrap().0;
        let r = req(b"POST /x HTTP/1.1\r\nContent-Length: 12\r\n\r\n");
        assert_eq!(r.body_len(), Ok(12));
        assert!(r.keep_alive());
        let r = req(b"GET /x HTTP/1.1\r\nConnection: close\r\n\r\n");
        assert_eq!(r.body_len(), Ok(0));
        assert!(!r.keep_alive());
        assert!(!req(b"GET /x HTTP/1.0\r\n\r\n").keep_alive());
        assert!(req(b"GET /x HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n").keep_alive());
        for (raw, err) in [
            (
                &b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"[..],
                HttpError::LengthRequired,
            ),
            (
                b"POST /x HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
                HttpError::BadRequest,
            ),
            (
                b"POST /x HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
                HttpError::BadRequest,
            ),
            (
                b"POST /x HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n",
                HttpError::PayloadTooLarge,
            ),
        ] {
            assert_eq!(req(raw).body_len(), Err(err));
        }
        let text = String::from_utf8(Response::text(200, "ok").encode_with(true)).unwrap();
        assert!(text.contains("Connection: keep-alive\r\n"));
    }

    #[test]
    fn encodes_responses() {
        let r = Response::json(400, r#"{"code":0,"message":"Transport unknown"}"#);
        let text = String::from_utf8(r.encode()).unwrap();
        assert!(text.starts_with("HTTP/1.1 400 Bad Request\r\n"));
        assert!(text.contains("Content-Length: 40\r\n"));
        assert!(text.ends_with("\r\n\r\n{\"code\":0,\"message\":\"Transport unknown\"}"));
    }
}
