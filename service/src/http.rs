//! The HTTP server of every service's management API (status, metrics,
//! management): an axum router served over a [`Listener`], HTTP/1.1 with
//! keep-alive, and bounds on everything a client controls:
//!
//! - request headers (and the wait for the next request on a kept-alive
//!   connection) must arrive within `header_timeout`;
//! - a response write that makes no progress for `write_timeout` (the
//!   client stopped reading) ends the connection;
//! - a request body must arrive whole within `body_timeout` and be at most
//!   `max_body_bytes`;
//! - a connection with no request in progress may be displaced by a new
//!   one when the listener is full (see `listener`); one serving a request,
//!   including a streamed response body, is not.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::Router;
use bytes::Bytes;
use http_body::Frame;
use hyper_util::rt::{TokioIo, TokioTimer};
use tracing::debug;

use crate::limits;
use crate::listener::{BusyGuard, Listener};

/// Bounds of an HTTP listener besides its connection limit.
#[derive(Clone, Copy, Debug)]
pub struct HttpLimits {
    pub header_timeout: Duration,
    pub write_timeout: Duration,
    pub body_timeout: Duration,
    pub max_body_bytes: usize,
}

impl Default for HttpLimits {
    fn default() -> HttpLimits {
        HttpLimits {
            header_timeout: limits::HTTP_HEADER_TIMEOUT,
            write_timeout: limits::HTTP_WRITE_TIMEOUT,
            body_timeout: limits::HTTP_BODY_TIMEOUT,
            max_body_bytes: limits::HTTP_MAX_BODY_BYTES,
        }
    }
}

/// The answer to a connection refused because the listener is full.
pub fn refusal(_first_bytes: &[u8]) -> Vec<u8> {
    let body = r#"{"error":"too many connections to this HTTP API; retry later"}"#;
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
         connection: close\r\nretry-after: 1\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Serves `router` on `listener` forever.
pub async fn serve(listener: Listener, router: Router, limits: HttpLimits) {
    let router = router.layer(axum::extract::DefaultBodyLimit::max(limits.max_body_bytes));
    listener
        .serve(move |conn| {
            let router = router.clone();
            async move {
                let peer = conn.peer;
                let (stream, slot) = match conn.secure().await {
                    Ok(secured) => secured,
                    Err(e) => return debug!(%peer, "TLS handshake failed: {e}"),
                };
                let slot = Arc::new(slot);
                let service = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let busy = slot.busy();
                    let mut router = router.clone();
                    async move {
                        let req: Request = req.map(|b| Body::new(DeadlineBody::new(b, limits.body_timeout)));
                        let response = tower_call(&mut router, req).await;
                        Ok::<_, Infallible>(response.map(|b| Body::new(BusyBody { inner: b, _busy: busy })))
                    }
                });
                let mut builder = hyper::server::conn::http1::Builder::new();
                builder.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout).keep_alive(true);
                let io = TokioIo::new(WriteDeadline::new(stream, limits.write_timeout));
                if let Err(e) = builder.serve_connection(io, service).await {
                    debug!(%peer, "HTTP connection ended: {e}");
                }
            }
        })
        .await
}

/// Calls the router as a tower service (it is always ready).
async fn tower_call(router: &mut Router, req: Request) -> axum::response::Response {
    use tower_service::Service;
    match router.call(req).await {
        Ok(response) => response,
        Err(never) => match never {},
    }
}

/// A response body that keeps its connection marked busy until it is
/// finished or dropped.
struct BusyBody {
    inner: Body,
    _busy: BusyGuard,
}

impl http_body::Body for BusyBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// A request body that fails unless it arrives whole within a deadline
/// (counted from the first read), so a slow sender cannot hold a busy
/// connection for long.
struct DeadlineBody {
    inner: hyper::body::Incoming,
    timeout: Duration,
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl DeadlineBody {
    fn new(inner: hyper::body::Incoming, timeout: Duration) -> DeadlineBody {
        DeadlineBody { inner, timeout, deadline: None }
    }
}

/// Why a request body was cut off.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within {0:?}")]
pub struct BodyTimeout(Duration);

impl http_body::Body for DeadlineBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let timeout = self.timeout;
        let deadline = self.deadline.get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        if deadline.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Some(Err(Box::new(BodyTimeout(timeout)))));
        }
        Pin::new(&mut self.inner).poll_frame(cx).map(|f| f.map(|r| r.map_err(Into::into)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// A stream whose writes fail once one has made no progress for `limit`:
/// a client that stops reading a response cannot hold its connection (and
/// a busy place in the listener) forever.
struct WriteDeadline<S> {
    inner: S,
    limit: Duration,
    /// Running while a write is pending; reset by any progress.
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<S> WriteDeadline<S> {
    fn new(inner: S, limit: Duration) -> WriteDeadline<S> {
        WriteDeadline { inner, limit, stalled: None }
    }

    /// Turns a pending write into an error once it has been pending too long.
    fn check<T>(&mut self, cx: &mut Context<'_>, poll: Poll<std::io::Result<T>>) -> Poll<std::io::Result<T>> {
        match poll {
            Poll::Ready(r) => {
                self.stalled = None;
                Poll::Ready(r)
            }
            Poll::Pending => {
                let limit = self.limit;
                let timer = self.stalled.get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
                if timer.as_mut().poll(cx).is_ready() {
                    let e = std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("the client took nothing for {limit:?}"),
                    );
                    return Poll::Ready(Err(e));
                }
                Poll::Pending
            }
        }
    }
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for WriteDeadline<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for WriteDeadline<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.check(cx, poll)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let poll = Pin::new(&mut self.inner).poll_flush(cx);
        self.check(cx, poll)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test]
    async fn a_write_nobody_reads_fails_after_the_limit() {
        let (client, _server) = tokio::io::duplex(1024);
        let mut w = WriteDeadline::new(client, Duration::from_millis(100));
        let started = std::time::Instant::now();
        let err = w.write_all(&vec![0u8; 64 * 1024]).await.unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
        assert!(started.elapsed() >= Duration::from_millis(100));
    }

    #[tokio::test]
    async fn a_slow_but_steady_reader_is_not_cut_off() {
        let (client, mut server) = tokio::io::duplex(1024);
        let reader = tokio::spawn(async move {
            use tokio::io::AsyncReadExt;
            let mut total = 0;
            let mut buf = [0u8; 512];
            while total < 16 * 1024 {
                tokio::time::sleep(Duration::from_millis(5)).await;
                total += server.read(&mut buf).await.unwrap();
            }
        });
        // Each write waits a little, never the whole limit.
        let mut w = WriteDeadline::new(client, Duration::from_millis(200));
        w.write_all(&vec![1u8; 16 * 1024]).await.unwrap();
        reader.await.unwrap();
    }

    #[test]
    fn refusal_is_a_complete_http_response() {
        let text = String::from_utf8(refusal(b"GET / HTTP/1.1")).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 503 "));
        assert!(head.contains(&format!("content-length: {}", body.len())));
        assert!(body.contains("too many connections"));
    }
}
