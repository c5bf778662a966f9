//! A small JSON-over-HTTP client for the services' APIs, with timeouts,
//! sending the CLI's management token when the cluster has one, over TLS
//! with the cluster's CA when it has one.

use std::sync::OnceLock;
use std::time::Duration;

use strata_service::auth::Token;
use strata_service::tls::ClientTls;

use serde::de::DeserializeOwned;
use serde::Serialize;
use strata_protocol::api::ErrorBody;

/// Timeout of a status query: services answer these at once or are unwell.
pub const QUICK: Duration = Duration::from_secs(3);

/// An HTTP answer: status code and body (JSON, or the raw text as a JSON string).
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub body: serde_json::Value,
}

impl Reply {
    /// The `error` field services put in failure bodies, else the whole body.
    pub fn error_text(&self) -> String {
        match serde_json::from_value::<ErrorBody>(self.body.clone()) {
            Ok(e) => e.error,
            Err(_) => self.body.to_string(),
        }
    }

    /// The body as the API document `T`.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, String> {
        serde_json::from_value(self.body.clone()).map_err(|e| format!("an unexpected answer: {e}"))
    }
}

/// The token every request of this process carries. A CLI process works
/// on one cluster, so it is set once, when the workdir is opened.
static TOKEN: OnceLock<Token> = OnceLock::new();

/// Sends `token` with every later request (the first call wins).
pub fn use_token(token: Token) {
    let _ = TOKEN.set(token);
}

/// The token this process sends, for calls that are not HTTP (the
/// safekeeper protocol).
pub fn token() -> Option<Token> {
    TOKEN.get().cloned()
}

fn authorized<B>(request: ureq::RequestBuilder<B>) -> ureq::RequestBuilder<B> {
    match TOKEN.get() {
        Some(t) => request.header("Authorization", t.bearer()),
        None => request,
    }
}

/// The TLS of every request of this process, set with the token.
static TLS: OnceLock<ClientTls> = OnceLock::new();

/// Speaks TLS with `tls`'s trust in every later request (the first call wins).
pub fn use_tls(tls: ClientTls) {
    let _ = TLS.set(tls);
}

/// The TLS in use, for calls that are not HTTP (the safekeeper protocol).
pub fn tls() -> Option<ClientTls> {
    TLS.get().cloned()
}

/// The scheme of the services' URLs: `https` once TLS is in use.
pub fn scheme() -> &'static str {
    if TLS.get().is_some() {
        "https"
    } else {
        "http"
    }
}

fn agent(timeout: Duration) -> ureq::Agent {
    let mut config = ureq::Agent::config_builder();
    if let Some(tls) = TLS.get() {
        config = config.tls_config(tls.http());
    }
    config
        .timeout_global(Some(timeout))
        // Error statuses are answers the callers act on (404: create it, 409: exists).
        .http_status_as_error(false)
        // Every service is on 127.0.0.1: a proxy from the environment must not be used.
        .proxy(None)
        .build()
        .into()
}

fn reply(result: Result<ureq::http::Response<ureq::Body>, ureq::Error>, url: &str) -> Result<Reply, String> {
    let mut response = result.map_err(|e| format!("{url}: {e}"))?;
    let status = response.status().as_u16();
    let text = response.body_mut().read_to_string().map_err(|e| format!("{url}: reading the answer: {e}"))?;
    let body = if text.trim().is_empty() {
        serde_json::Value::Null
    } else {
        serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text))
    };
    Ok(Reply { status, body })
}

/// `GET url`; an error only if no answer came (connection refused, timeout).
pub fn get(url: &str, timeout: Duration) -> Result<Reply, String> {
    reply(authorized(agent(timeout).get(url)).call(), url)
}

/// `POST url` with a JSON body; an error only if no answer came.
pub fn post(url: &str, body: &impl Serialize, timeout: Duration) -> Result<Reply, String> {
    let body = serde_json::to_string(body).expect("a request serializes");
    reply(authorized(agent(timeout).post(url)).content_type("application/json").send(body), url)
}

/// `DELETE url`; an error only if no answer came.
pub fn delete(url: &str, timeout: Duration) -> Result<Reply, String> {
    reply(authorized(agent(timeout).delete(url)).call(), url)
}

/// `PUT url` with a JSON body; an error only if no answer came.
pub fn put(url: &str, body: &impl Serialize, timeout: Duration) -> Result<Reply, String> {
    let body = serde_json::to_string(body).expect("a request serializes");
    reply(authorized(agent(timeout).put(url)).content_type("application/json").send(body), url)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

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
    fn statuses_and_bodies() {
        let (port, h) = serve_once("HTTP/1.1 404 Not Found\r\ncontent-length: 17\r\n\r\n{\"error\":\"nope\"}\n");
        let r = get(&format!("http://127.0.0.1:{port}/v1/x"), QUICK).unwrap();
        assert_eq!(r.status, 404);
        assert_eq!(r.error_text(), "nope");
        assert!(h.join().unwrap().starts_with("GET /v1/x "));

        let (port, h) = serve_once("HTTP/1.1 201 Created\r\ncontent-length: 8\r\n\r\n{\"a\":1}\n");
        let r = post(&format!("http://127.0.0.1:{port}/p"), &serde_json::json!({"k": "v"}), QUICK).unwrap();
        assert_eq!((r.status, r.body["a"].as_i64()), (201, Some(1)));
        let request = h.join().unwrap();
        assert!(request.contains("{\"k\":\"v\"}") && request.to_lowercase().contains("application/json"), "{request}");

        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        assert!(get(&format!("http://127.0.0.1:{closed}/"), QUICK).is_err());
    }
}
