//! Calls to the pageservers: their status (the heartbeat) and location
//! changes, behind [`Pageservers`] so that a simulation can answer them;
//! [`Client`] makes them over HTTP (blocking `ureq` on the blocking pool).

use std::time::Duration;

use strata_protocol::api::pageserver::{LocationRequest, LocationStatus, PageserverStatus};
use strata_protocol::api::ErrorBody;
use strata_protocol::TenantId;
use strata_service::auth::Token;
use strata_service::tls::ClientTls;

use crate::tasks::BoxFuture;

/// Largest answer accepted (a status lists every timeline).
const MAX_ANSWER: u64 = 16 << 20;
/// Bound on a location change: an attach lists and reads every index.
const LOCATION_TIMEOUT: Duration = Duration::from_secs(120);

/// What the controller asks of the pageservers, each named by its HTTP
/// address (`host:port`). Every call ends within a bound: a pageserver that
/// does not answer is an error after a timeout, not a wait.
pub trait Pageservers: Send + Sync {
    /// `GET /v1/status`: the heartbeat.
    fn status<'a>(&'a self, http: &'a str) -> BoxFuture<'a, Result<PageserverStatus, String>>;
    /// `PUT /v1/tenant/{tenant}/location`.
    fn set_location<'a>(
        &'a self,
        http: &'a str,
        tenant: TenantId,
        req: LocationRequest,
    ) -> BoxFuture<'a, Result<LocationStatus, String>>;
}

/// A client of every pageserver, with the controller's token and TLS.
#[derive(Clone)]
pub struct Client {
    heartbeat: ureq::Agent,
    location: ureq::Agent,
    scheme: &'static str,
    token: Option<Token>,
}

impl Client {
    /// Heartbeats time out after `heartbeat_timeout`.
    pub fn new(tls: Option<&ClientTls>, token: Option<Token>, heartbeat_timeout: Duration) -> Client {
        let agent = |timeout: Duration| -> ureq::Agent {
            let mut b = ureq::Agent::config_builder();
            if let Some(tls) = tls {
                b = b.tls_config(tls.http());
            }
            b.timeout_global(Some(timeout)).http_status_as_error(false).proxy(None).build().into()
        };
        Client {
            heartbeat: agent(heartbeat_timeout),
            location: agent(LOCATION_TIMEOUT),
            scheme: if tls.is_some() { "https" } else { "http" },
            token,
        }
    }

    fn call<T: serde::de::DeserializeOwned>(
        &self,
        agent: &ureq::Agent,
        method: &str,
        url: String,
        body: Option<String>,
    ) -> Result<T, String> {
        let auth = self.token.as_ref().map(|t| t.bearer());
        let result = match (method, body) {
            ("PUT", Some(b)) => {
                let mut r = agent.put(&url).header("Content-Type", "application/json");
                if let Some(a) = &auth {
                    r = r.header("Authorization", a);
                }
                r.send(b)
            }
            _ => {
                let mut r = agent.get(&url);
                if let Some(a) = &auth {
                    r = r.header("Authorization", a);
                }
                r.call()
            }
        };
        let mut response = result.map_err(|e| format!("{url}: {e}"))?;
        let status = response.status().as_u16();
        let text = response
            .body_mut()
            .with_config()
            .limit(MAX_ANSWER)
            .read_to_string()
            .map_err(|e| format!("{url}: reading the answer: {e}"))?;
        if status >= 300 {
            let message = serde_json::from_str::<ErrorBody>(&text).map(|b| b.error).unwrap_or(text);
            return Err(format!("{url}: HTTP {status}: {message}"));
        }
        serde_json::from_str(&text).map_err(|e| format!("{url}: malformed answer: {e}"))
    }
}

impl Pageservers for Client {
    fn status<'a>(&'a self, http: &'a str) -> BoxFuture<'a, Result<PageserverStatus, String>> {
        let (c, url) = (self.clone(), format!("{}://{http}/v1/status", self.scheme));
        Box::pin(async move {
            tokio::task::spawn_blocking(move || c.call(&c.heartbeat, "GET", url, None))
                .await
                .map_err(|e| e.to_string())?
        })
    }

    fn set_location<'a>(
        &'a self,
        http: &'a str,
        tenant: TenantId,
        req: LocationRequest,
    ) -> BoxFuture<'a, Result<LocationStatus, String>> {
        let (c, url) = (self.clone(), format!("{}://{http}/v1/tenant/{tenant}/location", self.scheme));
        let body = serde_json::to_string(&req).expect("a request always encodes");
        Box::pin(async move {
            tokio::task::spawn_blocking(move || c.call(&c.location, "PUT", url, Some(body)))
                .await
                .map_err(|e| e.to_string())?
        })
    }
}
