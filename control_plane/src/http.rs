//! The control plane's calls to the services' APIs: the services' one
//! client (`strata_service::api_client`) with this process's token (the
//! CLI's management token, or the node's service token) and the cluster's
//! CA, set once when the workdir is opened.

use std::sync::{OnceLock, RwLock};
use std::time::{Duration, Instant};

use strata_service::api_client::{self, ApiClient, ApiError};
use strata_service::auth::Token;
use strata_service::tls::ClientTls;

use serde::de::DeserializeOwned;
use serde::Serialize;
use strata_protocol::api::ErrorBody;

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

/// The token every request of this process carries, and when it was
/// minted if this process minted it. A process works on one cluster, so
/// a token given is set once (the first wins); a minted one is minted
/// again as it ages, for the processes that run for months and work as
/// the CLI does (the proxy, the console).
static TOKEN: RwLock<Option<(Token, Option<Instant>)>> = RwLock::new(None);

/// Sends `token` with every later request (the first call wins).
pub fn use_token(token: Token) {
    let mut slot = TOKEN.write().unwrap_or_else(|e| e.into_inner());
    if slot.is_none() {
        *slot = Some((token, None));
    }
}

/// Sends a token `mint` makes with every later request, unless a token
/// was given, or one it minted is younger than `renew_after`.
pub fn use_minted_token(
    renew_after: Duration,
    mint: impl FnOnce() -> Result<Option<Token>, String>,
) -> Result<(), String> {
    let fresh = |slot: &Option<(Token, Option<Instant>)>| match slot {
        None => false,
        Some((_, None)) => true,
        Some((_, Some(at))) => at.elapsed() < renew_after,
    };
    if fresh(&TOKEN.read().unwrap_or_else(|e| e.into_inner())) {
        return Ok(());
    }
    let mut slot = TOKEN.write().unwrap_or_else(|e| e.into_inner());
    if !fresh(&slot) {
        if let Some(token) = mint()? {
            *slot = Some((token, Some(Instant::now())));
        }
    }
    Ok(())
}

/// The token this process sends, for calls that are not HTTP (the
/// safekeeper protocol).
pub fn token() -> Option<Token> {
    TOKEN.read().unwrap_or_else(|e| e.into_inner()).as_ref().map(|(t, _)| t.clone())
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
    ApiClient::new(TLS.get(), token(), timeout)
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

/// Where this thread's calls go instead of the network: fakes of the
/// services, so that the operations run in unit tests without processes
/// (`crate::fakes`).
pub trait Transport {
    /// One call, as `send` would make it: a JSON reply, or an error when
    /// no answer came.
    fn call(&self, method: &str, url: &str, body: Option<serde_json::Value>) -> Result<Reply, String>;

    /// Whether the service whose API is at `base` runs, where the control
    /// plane would look at its process (on this machine); `None`: look.
    fn runs(&self, base: &str) -> Option<bool>;
}

thread_local! {
    static TRANSPORT: std::cell::RefCell<Option<std::rc::Rc<dyn Transport>>> = const { std::cell::RefCell::new(None) };
}

/// Runs `f` with this thread's calls going to `transport`.
pub fn with_transport<R>(transport: std::rc::Rc<dyn Transport>, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<std::rc::Rc<dyn Transport>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            TRANSPORT.with(|t| *t.borrow_mut() = self.0.take());
        }
    }
    let _restore = Restore(TRANSPORT.with(|t| t.borrow_mut().replace(transport)));
    f()
}

/// Whether this thread's transport says the service at `base` runs
/// (`None` without a transport: the caller looks at the process).
pub fn transport_says_running(base: &str) -> Option<bool> {
    TRANSPORT.with(|t| t.borrow().as_ref().and_then(|t| t.runs(base)))
}

/// One call: to this thread's transport if it has one, else over the network.
fn send<B: Serialize + ?Sized>(method: &str, url: &str, body: Option<&B>, timeout: Duration) -> Result<Reply, String> {
    if let Some(t) = TRANSPORT.with(|t| t.borrow().clone()) {
        let body = body.map(|b| serde_json::to_value(b).expect("a request serializes"));
        return t.call(method, url, body);
    }
    reply(client(timeout).send(method, url, body))
}

/// `GET url`; an error only if no answer came (connection refused, timeout).
pub fn get(url: &str, timeout: Duration) -> Result<Reply, String> {
    send::<()>("GET", url, None, timeout)
}

/// `POST url` with a JSON body; an error only if no answer came.
pub fn post(url: &str, body: &impl Serialize, timeout: Duration) -> Result<Reply, String> {
    send("POST", url, Some(body), timeout)
}

/// `DELETE url`; an error only if no answer came.
pub fn delete(url: &str, timeout: Duration) -> Result<Reply, String> {
    send::<()>("DELETE", url, None, timeout)
}

/// `PUT url` with a JSON body; an error only if no answer came.
pub fn put(url: &str, body: &impl Serialize, timeout: Duration) -> Result<Reply, String> {
    send("PUT", url, Some(body), timeout)
}

/// `PUT url` with the bytes `body` reads (`content_type`), streamed; an
/// error only if no answer came. A thread's fake transport is called with
/// no body.
pub fn put_stream(
    url: &str,
    content_type: &str,
    body: &mut dyn std::io::Read,
    timeout: Duration,
) -> Result<Reply, String> {
    if let Some(t) = TRANSPORT.with(|t| t.borrow().clone()) {
        return t.call("PUT", url, None);
    }
    reply(client(timeout).put_stream(url, content_type, body))
}

/// `GET url` of a large body: its reader when the answer is 200, else the
/// answer (`Err(Ok(reply))`), or why none came (`Err(Err(text))`). Not for
/// a thread's fake transport.
pub fn get_reader(
    url: &str,
    timeout: Duration,
) -> std::result::Result<Box<dyn std::io::Read + Send>, std::result::Result<Reply, String>> {
    if TRANSPORT.with(|t| t.borrow().is_some()) {
        return Err(Err(format!("GET {url}: not served by the fake transport")));
    }
    match client(timeout).get_reader(url) {
        Ok(Ok(reader)) => Ok(reader),
        Ok(Err(answer)) => Err(reply(Ok(answer))),
        Err(e) => Err(Err(e.to_string())),
    }
}
