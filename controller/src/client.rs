//! Calls to the pageservers: their status (the heartbeat) and location
//! changes, behind [`Pageservers`] so that a simulation can answer them;
//! [`Client`] makes them over HTTP (the services' one API client, on the
//! blocking pool).

use std::time::Duration;

use strata_protocol::api::pageserver::{
    LocationRequest, LocationStatus, PageserverStatus, SplitShardDone, SplitShardRequest,
};
use strata_protocol::TenantShardId;
use strata_service::api_client::ApiClient;
use strata_service::auth::Token;
use strata_service::tls::ClientTls;

use crate::limits::{LOCATION_TIMEOUT, MAX_ANSWER, SPLIT_CALL_TIMEOUT};
use crate::tasks::BoxFuture;

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
        tenant: TenantShardId,
        req: LocationRequest,
    ) -> BoxFuture<'a, Result<LocationStatus, String>>;
    /// `POST /v1/tenant/{parent}/split`: the parent's children's indexes.
    /// `Err((permanent, why))`: permanent when asking again cannot help
    /// (the request was refused as invalid).
    fn split_shard<'a>(
        &'a self,
        http: &'a str,
        parent: TenantShardId,
        req: SplitShardRequest,
    ) -> BoxFuture<'a, Result<SplitShardDone, (bool, String)>> {
        let _ = (http, parent, req);
        Box::pin(async { Err((true, "this pageserver client cannot split shards".to_string())) })
    }
}

/// A client of every pageserver, with the controller's token and TLS: the
/// services' one API client, with a timeout per kind of call.
#[derive(Clone)]
pub struct Client {
    heartbeat: ApiClient,
    location: ApiClient,
    split: ApiClient,
}

impl Client {
    /// Heartbeats time out after `heartbeat_timeout`.
    pub fn new(tls: Option<&ClientTls>, token: Option<Token>, heartbeat_timeout: Duration) -> Client {
        let client = |timeout| ApiClient::new(tls, token.clone(), timeout).with_max_answer(MAX_ANSWER);
        Client {
            heartbeat: client(heartbeat_timeout),
            location: client(LOCATION_TIMEOUT),
            split: client(SPLIT_CALL_TIMEOUT),
        }
    }
}

impl Pageservers for Client {
    fn status<'a>(&'a self, http: &'a str) -> BoxFuture<'a, Result<PageserverStatus, String>> {
        let (c, url) = (self.heartbeat.clone(), self.heartbeat.url(http, "/v1/status"));
        Box::pin(async move {
            tokio::task::spawn_blocking(move || c.get(&url).map_err(|e| e.to_string()))
                .await
                .map_err(|e| e.to_string())?
        })
    }

    fn set_location<'a>(
        &'a self,
        http: &'a str,
        tenant: TenantShardId,
        req: LocationRequest,
    ) -> BoxFuture<'a, Result<LocationStatus, String>> {
        let (c, url) = (self.location.clone(), self.location.url(http, &format!("/v1/tenant/{tenant}/location")));
        Box::pin(async move {
            tokio::task::spawn_blocking(move || c.put(&url, &req).map_err(|e| e.to_string()))
                .await
                .map_err(|e| e.to_string())?
        })
    }

    fn split_shard<'a>(
        &'a self,
        http: &'a str,
        parent: TenantShardId,
        req: SplitShardRequest,
    ) -> BoxFuture<'a, Result<SplitShardDone, (bool, String)>> {
        let (c, url) = (self.split.clone(), self.split.url(http, &format!("/v1/tenant/{parent}/split")));
        Box::pin(async move {
            let r = tokio::task::spawn_blocking(move || c.post::<SplitShardDone>(&url, &req))
                .await
                .map_err(|e| (false, e.to_string()))?;
            r.map_err(|e| (e.status() == Some(400), e.to_string()))
        })
    }
}
