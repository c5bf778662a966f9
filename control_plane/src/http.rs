//! The control plane's calls to the services' APIs: the services' one
//! client (`strata_service::api_client`) with this process's token (the
//! CLI's management token, or the node's service token) and the cluster's
//! CA, set once when the workdir is opened.

use std::sync::OnceLock;
use std::time::Duration;

use strata_service::api_client::{self, ApiClient, ApiError};
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

/// The client of one call: this process's trust and token, and `timeout`.
fn client(timeout: Duration) -> ApiClient {
    ApiClient::new(TLS.get(), TOKEN.get().cloned(), timeout)
}

/// The answer as the callers read it: a JSON body, or its text as a string.
fn reply(result: Result<api_client::Reply, ApiError>) -> Result<Reply, String> {
    let answer = result.map_err(|e| e.to_string())?;
    let body = if answer.text.trim().is_empty() {
        serde_json::Value::Null
    } else {
        serde_json::from_str(&answer.text).unwrap_or(serde_json::Value::String(answer.text))
    };
    Ok(Reply { status: answer.status, body })
}

/// `GET url`; an error only if no answer came (connection refused, timeout).
pub fn get(url: &str, timeout: Duration) -> Result<Reply, String> {
    reply(client(timeout).send::<()>("GET", url, None))
}

/// `POST url` with a JSON body; an error only if no answer came.
pub fn post(url: &str, body: &impl Serialize, timeout: Duration) -> Result<Reply, String> {
    reply(client(timeout).send("POST", url, Some(body)))
}

/// `DELETE url`; an error only if no answer came.
pub fn delete(url: &str, timeout: Duration) -> Result<Reply, String> {
    reply(client(timeout).send::<()>("DELETE", url, None))
}

/// `PUT url` with a JSON body; an error only if no answer came.
pub fn put(url: &str, body: &impl Serialize, timeout: Duration) -> Result<Reply, String> {
    reply(client(timeout).send("PUT", url, Some(body)))
}
