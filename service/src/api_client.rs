//! One client of the services' management APIs (JSON over HTTP), used by
//! the control plane, the storage controller, the compute agent and the
//! safekeepers' peers alike: TLS with the cluster's CA when given, a bearer
//! token when given, a timeout on every request, a bound on every answer,
//! and never a proxy from the environment (services are addressed
//! directly; a proxy would see their tokens).
//!
//! Requests are blocking (`ureq`): async callers run them on tokio's
//! blocking pool.

use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;
use strata_protocol::api::ErrorBody;

use crate::auth::Token;
use crate::limits::{DEFAULT_MAX_ANSWER, MAX_ERROR_TEXT};
use crate::tls::ClientTls;

/// Why a request failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    /// No answer (connection refused, timed out, reset): worth retrying.
    #[error("{url}: {message}")]
    Unreachable { url: String, message: String },
    /// An HTTP error status, with the `error` message of its JSON body.
    #[error("{url}: HTTP {status}: {message}")]
    Status { url: String, status: u16, message: String },
    /// An answer that is not what the API promises.
    #[error("{url}: {message}")]
    Invalid { url: String, message: String },
}

impl ApiError {
    /// Whether the service may answer if asked again (down, starting, overloaded).
    pub fn is_transient(&self) -> bool {
        match self {
            ApiError::Unreachable { .. } => true,
            ApiError::Status { status, .. } => *status == 503,
            ApiError::Invalid { .. } => false,
        }
    }

    /// The HTTP status of an error answer.
    pub fn status(&self) -> Option<u16> {
        match self {
            ApiError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// An answer of any status, for callers that act on error statuses
/// themselves (404: create it; 409: it exists).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub url: String,
    pub status: u16,
    /// The body as text (at most the client's bound).
    pub text: String,
}

impl Reply {
    /// Whether the status is a success (2xx).
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The body as the API document `T`.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, ApiError> {
        serde_json::from_str(&self.text)
            .map_err(|e| ApiError::Invalid { url: self.url.clone(), message: format!("an unexpected answer: {e}") })
    }

    /// The `error` field services put in failure bodies, else the body itself (shortened).
    pub fn error_message(&self) -> String {
        error_message(&self.text)
    }

    /// `T` from a success, else the error status with its message.
    pub fn into_result<T: DeserializeOwned>(self) -> Result<T, ApiError> {
        if !self.is_success() {
            let message = self.error_message();
            return Err(ApiError::Status { url: self.url, status: self.status, message });
        }
        self.json()
    }
}

/// The `error` field of a JSON error body, else the body itself (shortened).
pub fn error_message(body: &str) -> String {
    if let Ok(e) = serde_json::from_str::<ErrorBody>(body) {
        return e.error;
    }
    let trimmed = body.trim();
    if trimmed.is_empty() {
        return "(no body)".into();
    }
    let mut end = trimmed.len().min(MAX_ERROR_TEXT);
    while !trimmed.is_char_boundary(end) {
        end -= 1;
    }
    trimmed[..end].to_string()
}

/// No answer came from `url`.
fn unreachable(url: &str, e: ureq::Error) -> ApiError {
    ApiError::Unreachable { url: url.to_string(), message: e.to_string() }
}

/// A client of one kind of call: its trust, its token and its timeout.
#[derive(Clone)]
pub struct ApiClient {
    agent: ureq::Agent,
    scheme: &'static str,
    token: Option<Token>,
    max_answer: u64,
}

impl std::fmt::Debug for ApiClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiClient").field("scheme", &self.scheme).field("token", &self.token.is_some()).finish()
    }
}

impl ApiClient {
    /// Every request of this client ends within `timeout` (connect, send,
    /// and the whole answer).
    pub fn new(tls: Option<&ClientTls>, token: Option<Token>, timeout: Duration) -> ApiClient {
        let mut config = ureq::Agent::config_builder();
        if let Some(tls) = tls {
            config = config.tls_config(tls.http());
        }
        let agent = config
            .timeout_global(Some(timeout))
            // Error statuses are answers: the callers decide what they mean.
            .http_status_as_error(false)
            .proxy(None)
            .build()
            .into();
        ApiClient { agent, scheme: if tls.is_some() { "https" } else { "http" }, token, max_answer: DEFAULT_MAX_ANSWER }
    }

    /// The same, sending `token` with every request (none: no token).
    pub fn with_token(mut self, token: Option<Token>) -> ApiClient {
        self.token = token;
        self
    }

    /// The same, reading answers of at most `bytes`.
    pub fn with_max_answer(mut self, bytes: u64) -> ApiClient {
        self.max_answer = bytes;
        self
    }

    /// `http` or `https`, as the client speaks.
    pub fn scheme(&self) -> &'static str {
        self.scheme
    }

    /// The URL of `path` (starting with `/`) at `address` (`host:port`).
    pub fn url(&self, address: &str, path: &str) -> String {
        debug_assert!(path.starts_with('/'), "a path starts with a slash: {path}");
        format!("{}://{address}{path}", self.scheme)
    }

    fn authorized<B>(&self, request: ureq::RequestBuilder<B>) -> ureq::RequestBuilder<B> {
        match &self.token {
            Some(t) => request.header("Authorization", t.bearer()),
            None => request,
        }
    }

    /// Sends a request (`GET`, `DELETE`, or `POST`/`PUT` with a JSON body,
    /// `POST` also without) and reads its answer, whatever its status; an
    /// error only if no answer came, or it could not be read.
    pub fn send<B: Serialize + ?Sized>(&self, method: &str, url: &str, body: Option<&B>) -> Result<Reply, ApiError> {
        let json = || serde_json::to_string(&body).expect("a request serializes");
        let result = match (method, body.is_some()) {
            ("GET", false) => self.authorized(self.agent.get(url)).call(),
            ("DELETE", false) => self.authorized(self.agent.delete(url)).call(),
            ("POST", false) => self.authorized(self.agent.post(url)).send_empty(),
            ("POST", true) => self.authorized(self.agent.post(url)).content_type("application/json").send(json()),
            ("PUT", true) => self.authorized(self.agent.put(url)).content_type("application/json").send(json()),
            (other, with_body) => {
                panic!("no {other} request {} a body here", if with_body { "with" } else { "without" })
            }
        };
        self.answer(url, result.map_err(|e| unreachable(url, e))?)
    }

    /// `PUT url` whose body is what `body` reads, of type `content_type`,
    /// sent as it is read (chunked); the answer whatever its status, as
    /// `send`. The client's timeout bounds the whole upload.
    pub fn put_stream(&self, url: &str, content_type: &str, body: &mut dyn std::io::Read) -> Result<Reply, ApiError> {
        let result =
            self.authorized(self.agent.put(url)).content_type(content_type).send(ureq::SendBody::from_reader(body));
        self.answer(url, result.map_err(|e| unreachable(url, e))?)
    }

    /// `GET url` of a body too large to hold (a basebackup): the reader of
    /// a 200 answer's body, or the status and text of any other answer.
    /// The client's timeout bounds the whole transfer.
    pub fn get_reader(&self, url: &str) -> Result<Result<Box<dyn std::io::Read + Send>, Reply>, ApiError> {
        let response = self.authorized(self.agent.get(url)).call().map_err(|e| unreachable(url, e))?;
        if response.status().as_u16() == 200 {
            return Ok(Ok(Box::new(response.into_body().into_reader())));
        }
        self.answer(url, response).map(Err)
    }

    /// A response's status and text (at most `max_answer` bytes).
    fn answer(&self, url: &str, mut response: ureq::http::Response<ureq::Body>) -> Result<Reply, ApiError> {
        let status = response.status().as_u16();
        let text =
            response.body_mut().with_config().limit(self.max_answer).read_to_string().map_err(|e| {
                ApiError::Unreachable { url: url.to_string(), message: format!("reading the answer: {e}") }
            })?;
        Ok(Reply { url: url.to_string(), status, text })
    }

    /// `GET url`: the answer as `T`, or the error status.
    pub fn get<T: DeserializeOwned>(&self, url: &str) -> Result<T, ApiError> {
        self.send::<()>("GET", url, None)?.into_result()
    }

    /// `PUT url` with a JSON body: the answer as `T`, or the error status.
    pub fn put<T: DeserializeOwned>(&self, url: &str, body: &impl Serialize) -> Result<T, ApiError> {
        self.send("PUT", url, Some(body))?.into_result()
    }

    /// `POST url` with a JSON body: the answer as `T`, or the error status.
    pub fn post<T: DeserializeOwned>(&self, url: &str, body: &impl Serialize) -> Result<T, ApiError> {
        self.send("POST", url, Some(body))?.into_result()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    const QUICK: Duration = Duration::from_secs(3);

    /// Serves one canned answer on a local port and returns what was asked.
    fn serve_once(answer: &'static str) -> (u16, std::thread::JoinHandle<String>) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let handle = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            // Headers and body may arrive in separate reads: read the whole request.
            let mut request = Vec::new();
            let mut buf = [0u8; 4096];
            loop {
                let n = s.read(&mut buf).unwrap();
                if n == 0 {
                    break;
                }
                request.extend_from_slice(&buf[..n]);
                let text = String::from_utf8_lossy(&request).to_lowercase();
                if let Some(end) = text.find("\r\n\r\n") {
                    let len = text
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:").map(|v| v.trim().parse::<usize>().unwrap()))
                        .unwrap_or(0);
                    if request.len() >= end + 4 + len {
                        break;
                    }
                }
            }
            s.write_all(answer.as_bytes()).unwrap();
            String::from_utf8_lossy(&request).into_owned()
        });
        (port, handle)
    }

    #[test]
    fn statuses_bodies_and_tokens() {
        let token = Token::new("t0k3n".into());
        let client = ApiClient::new(None, Some(token), QUICK);
        let (port, h) = serve_once("HTTP/1.1 404 Not Found\r\ncontent-length: 17\r\n\r\n{\"error\":\"nope\"}\n");
        let url = client.url(&format!("127.0.0.1:{port}"), "/v1/x");
        let e = client.get::<serde_json::Value>(&url).unwrap_err();
        assert_eq!(e, ApiError::Status { url: url.clone(), status: 404, message: "nope".into() });
        assert!(!e.is_transient() && e.status() == Some(404));
        let request = h.join().unwrap();
        assert!(request.starts_with("GET /v1/x ") && request.contains("Bearer t0k3n"), "{request}");

        let (port, h) = serve_once("HTTP/1.1 201 Created\r\ncontent-length: 8\r\n\r\n{\"a\":1}\n");
        let url = format!("http://127.0.0.1:{port}/p");
        let answer: serde_json::Value = client.post(&url, &serde_json::json!({"k": "v"})).unwrap();
        assert_eq!(answer["a"].as_i64(), Some(1));
        let request = h.join().unwrap();
        assert!(request.contains("{\"k\":\"v\"}") && request.to_lowercase().contains("application/json"), "{request}");

        let (port, _h) = serve_once("HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\nnot json\n");
        let url = format!("http://127.0.0.1:{port}/q");
        assert!(matches!(client.get::<serde_json::Value>(&url), Err(ApiError::Invalid { .. })));

        let (port, _h) = serve_once("HTTP/1.1 503 Service Unavailable\r\ncontent-length: 4\r\n\r\nbusy");
        let reply = client.send::<()>("DELETE", &format!("http://127.0.0.1:{port}/d"), None).unwrap();
        assert_eq!((reply.status, reply.error_message().as_str()), (503, "busy"));
        assert!(reply.into_result::<serde_json::Value>().unwrap_err().is_transient());

        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let e = client.get::<serde_json::Value>(&format!("http://127.0.0.1:{closed}/")).unwrap_err();
        assert!(matches!(e, ApiError::Unreachable { .. }) && e.is_transient());
    }

    #[test]
    fn answers_over_the_bound_are_refused() {
        let client = ApiClient::new(None, None, QUICK).with_max_answer(4);
        let (port, _h) = serve_once("HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n0123456789");
        let e = client.get::<serde_json::Value>(&format!("http://127.0.0.1:{port}/big")).unwrap_err();
        assert!(e.to_string().contains("reading the answer"), "{e}");
    }

    #[test]
    fn error_messages_come_from_the_body() {
        assert_eq!(error_message("{\"error\":\"no such timeline\"}"), "no such timeline");
        assert_eq!(error_message("  \n"), "(no body)");
        assert_eq!(error_message(&"é".repeat(400)).len(), 500);
    }
}
