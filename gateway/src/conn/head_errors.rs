//! OpenAI-shaped bodies for the errors hyper answers by itself.
//!
//! When a request head cannot be parsed (a malformed request line or header field, input that
//! is not HTTP at all, a header section over hyper's limits, a URI too long), hyper 1.x writes
//! an automatic `400`, `431` or `414` with `content-length: 0` and closes the connection; it
//! offers no hook for that response (it never reaches the service). [`HeadErrors`] wraps the
//! connection's stream and replaces exactly that response on its way out: a head that starts a
//! write, has one of those statuses and an empty body, becomes the same status with an OpenAI
//! error body and `connection: close`.
//!
//! Nothing the service answers is touched: every error it sends has a body
//! (`layers::openai_errors`), and a successful or bodied response never matches. If hyper's
//! head ever arrived split over writes, it would pass through unchanged (still a valid
//! answer, only without the body).

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use axum::http::StatusCode;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::error::GatewayError;

/// The statuses hyper answers on its own for a head it cannot parse (`on_error` in hyper's
/// server role), and what they mean to a client.
fn meaning(status: u16) -> Option<&'static str> {
    match status {
        400 => Some(
            "the request could not be parsed as HTTP/1.1: its request line (method, target, \
             version) or a header field is malformed",
        ),
        414 => Some("the request target (URI) is too long"),
        431 => Some(
            "the request's header section is too large or has too many fields; send fewer or \
             shorter headers",
        ),
        _ => None,
    }
}

/// If `buf` starts with one of hyper's automatic error heads (empty body), the length of that
/// head and the response to send instead.
pub fn replacement(buf: &[u8]) -> Option<(usize, Vec<u8>)> {
    let rest = buf
        .strip_prefix(b"HTTP/1.1 ")
        .or_else(|| buf.strip_prefix(b"HTTP/1.0 "))?;
    let code: u16 = std::str::from_utf8(rest.get(..3)?).ok()?.parse().ok()?;
    let message = meaning(code)?;
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&buf[..end]).ok()?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next()?;
    let mut kept = Vec::new();
    let mut empty_body = false;
    for line in lines {
        let (name, value) = line.split_once(':')?;
        let name = name.trim().to_ascii_lowercase();
        match name.as_str() {
            "content-length" => empty_body = value.trim() == "0",
            "transfer-encoding" => return None,
            "connection" | "content-type" => {}
            _ => kept.push(line),
        }
    }
    if !empty_body {
        return None;
    }
    let status = StatusCode::from_u16(code).ok()?;
    let error = GatewayError::Protocol {
        status,
        message: message.to_string(),
    };
    let body = serde_json::to_vec(&error.body()).ok()?;
    let mut out = Vec::with_capacity(256 + body.len());
    out.extend_from_slice(status_line.as_bytes());
    out.extend_from_slice(b"\r\n");
    for line in kept {
        out.extend_from_slice(line.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"content-type: application/json\r\nconnection: close\r\n");
    out.extend_from_slice(format!("content-length: {}\r\n\r\n", body.len()).as_bytes());
    out.extend_from_slice(&body);
    Some((end + 4, out))
}

/// A connection's stream whose outgoing automatic error heads get OpenAI bodies.
pub struct HeadErrors<S> {
    inner: S,
    /// A replacement still being written, and how much of it went out.
    out: Vec<u8>,
    sent: usize,
}

impl<S> HeadErrors<S> {
    pub fn new(inner: S) -> HeadErrors<S> {
        HeadErrors {
            inner,
            out: Vec::new(),
            sent: 0,
        }
    }
}

impl<S: AsyncWrite + Unpin> HeadErrors<S> {
    /// Writes what is left of a replacement.
    fn poll_pending(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.sent < self.out.len() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.out[self.sent..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.sent += n;
        }
        self.out.clear();
        self.sent = 0;
        Poll::Ready(Ok(()))
    }

    /// Takes `buf` (hyper's) as written if it starts with an automatic error head, queueing
    /// the replacement; the number of hyper's bytes taken.
    fn poll_replace(&mut self, cx: &mut Context<'_>, buf: &[u8]) -> Option<io::Result<usize>> {
        let (taken, out) = replacement(buf)?;
        self.out = out;
        self.sent = 0;
        match self.poll_pending(cx) {
            Poll::Ready(Err(e)) => Some(Err(e)),
            // Written, or the rest goes out on the next write, flush or shutdown.
            _ => Some(Ok(taken)),
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for HeadErrors<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for HeadErrors<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        ready!(self.poll_pending(cx))?;
        if let Some(r) = self.poll_replace(cx, buf) {
            return Poll::Ready(r);
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        ready!(self.poll_pending(cx))?;
        if let Some(first) = bufs.iter().find(|b| !b.is_empty()) {
            if let Some(r) = self.poll_replace(cx, first) {
                return Poll::Ready(r);
            }
        }
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_pending(cx))?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_pending(cx))?;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hypers_empty_error_heads_get_an_openai_body_and_nothing_else_does() {
        let head = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\ndate: Tue, 01 Dec 2026 \
                     00:00:00 GMT\r\n\r\n";
        let (taken, out) = replacement(head).expect("replaced");
        assert_eq!(taken, head.len());
        let text = String::from_utf8(out).unwrap();
        let (h, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(h.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{h}");
        assert!(h.contains("date: Tue"), "{h}");
        assert!(h.contains("content-type: application/json"), "{h}");
        assert!(
            h.contains(&format!("content-length: {}", body.len())),
            "{h}"
        );
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert!(v["error"]["message"].as_str().unwrap().contains("parsed"));

        for (status, word) in [
            ("431 Request Header Fields Too Large", "header"),
            ("414 URI Too Long", "URI"),
        ] {
            let h = format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\n\r\n");
            let (_, out) = replacement(h.as_bytes()).unwrap();
            assert!(String::from_utf8(out).unwrap().contains(word));
        }
        // Responses of the service: bodied errors, successes, chunked, other statuses.
        for other in [
            "HTTP/1.1 400 Bad Request\r\ncontent-length: 12\r\n\r\n{\"error\":{}}",
            "HTTP/1.1 400 Bad Request\r\ntransfer-encoding: chunked\r\ncontent-length: 0\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
            "HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n",
            "HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n",
            "5\r\nHTTP/\r\n",
        ] {
            assert!(replacement(other.as_bytes()).is_none(), "{other}");
        }
    }

    #[tokio::test]
    async fn a_malformed_head_is_answered_with_a_json_body_through_hyper() {
        use hyper::server::conn::http1;
        use hyper_util::rt::TokioIo;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};

        for request in [
            &b"GET / HTTP/1.1\r\nbad header line\r\n\r\n"[..],
            b"hello, this is not http\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: x\r\nX: \x01\r\n\r\n",
        ] {
            let (client, server) = tokio::io::duplex(4096);
            let svc = hyper::service::service_fn(|_req| async {
                Ok::<_, std::convert::Infallible>(hyper::Response::new(String::from("ok")))
            });
            let conn =
                http1::Builder::new().serve_connection(TokioIo::new(HeadErrors::new(server)), svc);
            let served = tokio::spawn(conn);
            let mut client = client;
            client.write_all(request).await.unwrap();
            let mut answer = Vec::new();
            client.read_to_end(&mut answer).await.unwrap();
            let _ = served.await;
            let text = String::from_utf8_lossy(&answer);
            assert!(text.starts_with("HTTP/1.1 400 "), "{text}");
            let body = text.split_once("\r\n\r\n").unwrap().1;
            let v: serde_json::Value = serde_json::from_str(body).expect(&text);
            assert!(v["error"]["message"].is_string(), "{text}");
        }
    }

    #[tokio::test]
    async fn on_a_kept_alive_connection_only_the_bad_request_is_rewritten() {
        use hyper::server::conn::http1;
        use hyper_util::rt::TokioIo;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};

        let (mut client, server) = tokio::io::duplex(8192);
        let svc = hyper::service::service_fn(|_req| async {
            Ok::<_, std::convert::Infallible>(hyper::Response::new(String::from("ok")))
        });
        let served = tokio::spawn(
            http1::Builder::new().serve_connection(TokioIo::new(HeadErrors::new(server)), svc),
        );
        client
            .write_all(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nno colon\r\n\r\n")
            .await
            .unwrap();
        let mut answer = Vec::new();
        client.read_to_end(&mut answer).await.unwrap();
        let _ = served.await;
        let text = String::from_utf8_lossy(&answer);
        // The first answer is the service's, untouched; the second is the rewritten 400.
        let (first, second) = text.split_once("HTTP/1.1 400 ").expect(&text);
        assert!(
            first.starts_with("HTTP/1.1 200 OK\r\n") && first.ends_with("\r\n\r\nok"),
            "{text}"
        );
        let body = second.split_once("\r\n\r\n").unwrap().1;
        let v: serde_json::Value = serde_json::from_str(body).expect(&text);
        assert_eq!(v["error"]["type"], "invalid_request_error", "{text}");
    }
}
