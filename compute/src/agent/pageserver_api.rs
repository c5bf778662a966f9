//! A client of the pageserver's HTTP API: timeline information and
//! basebackups. Requests are blocking (`ureq`); async callers go through
//! [`tokio::task::spawn_blocking`], as the helpers here do.

use std::io::Read;
use std::sync::Arc;
use std::time::Duration;

use strata_formats::Lsn;
use strata_protocol::api::pageserver::{CheckpointRecordResponse, LeaseRequest};
use strata_protocol::shard::ShardIndex;
use strata_protocol::{TenantId, TenantShardId, TimelineId};
use strata_service::api_client::{self, ApiClient};
use strata_service::auth::Token;
use strata_service::clock::Clock;
use strata_service::tls::ClientTls;

/// The pageserver's description of a timeline.
pub use strata_protocol::api::pageserver::TimelineStatus;

/// Why a request failed (the services' one client's error).
pub use strata_service::api_client::ApiError;

/// The pageserver's HTTP endpoint.
#[derive(Clone, Debug)]
pub struct PageserverClient {
    base: String,
    json: ApiClient,
    stream: ureq::Agent,
    token: Option<Token>,
    /// Where the pageserver is now, read before every request (a
    /// failover moves it); `base` until then.
    target: Option<(Following, &'static str)>,
    /// The shard asked for in every path (unsharded: the bare tenant id),
    /// unless it follows the tenant's shard 0.
    shard: ShardIndex,
}

/// What a client follows.
#[derive(Clone, Debug)]
enum Following {
    /// One pageserver (one shard's, or an unsharded tenant's).
    One(crate::pageserver_target::PageserverTarget),
    /// The tenant's shard 0, whichever layout it has now (a split changes
    /// its id as well as where it is).
    Home(crate::pageserver_target::TenantShards),
}

impl PageserverClient {
    /// A client of `address` (`host:port`, or a URL starting with
    /// `http://` or `https://`); over TLS with `tls`'s trust when given.
    pub fn new(address: &str, tls: Option<&ClientTls>) -> PageserverClient {
        let scheme = if tls.is_some() { "https" } else { "http" };
        let base = if address.contains("://") { address.to_string() } else { format!("{scheme}://{address}") };
        let config = || {
            let c = ureq::Agent::config_builder();
            match tls {
                Some(tls) => c.tls_config(tls.http()),
                None => c,
            }
        };
        let json = ApiClient::new(tls, None, crate::limits::PAGESERVER_REQUEST_TIMEOUT)
            .with_max_answer(crate::limits::MAX_JSON_BYTES);
        let stream = config()
            .http_status_as_error(false)
            .timeout_connect(Some(crate::limits::PAGESERVER_CONNECT_TIMEOUT))
            .timeout_send_request(Some(crate::limits::PAGESERVER_CONNECT_TIMEOUT))
            .timeout_recv_response(Some(crate::limits::BASEBACKUP_RESPONSE_TIMEOUT))
            .timeout_per_read(Some(crate::limits::BASEBACKUP_READ_TIMEOUT))
            .build()
            .into();
        PageserverClient {
            base: base.trim_end_matches('/').to_string(),
            json,
            stream,
            token: None,
            target: None,
            shard: ShardIndex::UNSHARDED,
        }
    }

    /// The same, sending every request to where `target` says the pageserver is.
    pub fn following(mut self, target: crate::pageserver_target::PageserverTarget) -> PageserverClient {
        let scheme = if self.base.starts_with("https://") { "https" } else { "http" };
        self.target = Some((Following::One(target), scheme));
        self
    }

    /// The same, asking the tenant's shard 0 wherever and whichever it is
    /// now (after a split: the new layout's shard 0).
    pub fn following_home(mut self, shards: crate::pageserver_target::TenantShards) -> PageserverClient {
        let scheme = if self.base.starts_with("https://") { "https" } else { "http" };
        self.target = Some((Following::Home(shards), scheme));
        self
    }

    /// The same, asking for `shard` of the tenants it is given.
    pub fn of_shard(mut self, shard: TenantShardId) -> PageserverClient {
        self.shard = shard.shard;
        self
    }

    /// The base URL now.
    fn base(&self) -> String {
        match &self.target {
            Some((Following::One(t), scheme)) => format!("{scheme}://{}", t.http()),
            Some((Following::Home(s), scheme)) => format!("{scheme}://{}", s.home().http()),
            None => self.base.clone(),
        }
    }

    /// The shard asked for now.
    fn shard(&self) -> ShardIndex {
        match &self.target {
            Some((Following::Home(s), _)) => s.home_index(),
            _ => self.shard,
        }
    }

    /// The same, sending `token` with every request.
    pub fn with_token(mut self, token: Option<Token>) -> PageserverClient {
        self.json = self.json.with_token(token.clone());
        self.token = token;
        self
    }

    /// The `Authorization` header's value, if there is a token.
    fn authorization(&self) -> Option<String> {
        self.token.as_ref().map(Token::bearer)
    }

    fn timeline_url(&self, tenant: TenantId, timeline: TimelineId) -> String {
        let tenant = TenantShardId { tenant, shard: self.shard() };
        format!("{}/v1/tenant/{tenant}/timeline/{timeline}", self.base())
    }

    /// `GET /v1/tenant/{tenant}/timeline/{timeline}`.
    pub fn timeline(&self, tenant: TenantId, timeline: TimelineId) -> Result<TimelineStatus, ApiError> {
        self.get_json(&self.timeline_url(tenant, timeline), "timeline description")
    }

    /// `GET …/checkpoint_record?lsn=`: the last checkpoint record that ends
    /// at or before `lsn`, where a standby can start (`docs/replicas.md`).
    pub fn checkpoint_record(
        &self,
        tenant: TenantId,
        timeline: TimelineId,
        lsn: Lsn,
    ) -> Result<CheckpointRecordResponse, ApiError> {
        let url = format!("{}/checkpoint_record?lsn={}", self.timeline_url(tenant, timeline), lsn_query(lsn));
        self.get_json(&url, "checkpoint record")
    }

    /// A GET answered with JSON (`what` names it in errors).
    fn get_json<T: serde::de::DeserializeOwned>(&self, url: &str, what: &str) -> Result<T, ApiError> {
        self.json.get(url).map_err(|e| match e {
            ApiError::Invalid { url, message } => {
                ApiError::Invalid { url, message: format!("unexpected {what}: {message}") }
            }
            other => other,
        })
    }

    /// `POST …/lease`: keeps `lsn` readable for a while (a read-only
    /// compute renews it every minute, `docs/branches.md`).
    /// A replica names itself (`holder`): its lease moves with it.
    pub fn lease(
        &self,
        tenant: TenantId,
        timeline: TimelineId,
        lsn: Lsn,
        holder: Option<&str>,
    ) -> Result<(), ApiError> {
        let url = format!("{}/lease", self.timeline_url(tenant, timeline));
        let body = LeaseRequest { lsn, holder: holder.map(str::to_string) };
        let reply = self.json.send("POST", &url, Some(&body))?;
        if reply.status != 200 {
            let message = reply.error_message();
            return Err(ApiError::Status { url, status: reply.status, message });
        }
        Ok(())
    }

    /// [`Self::lease`] on each of `clients` (every shard of a tenant: each
    /// keeps its own pages, so each must keep `lsn` readable).
    pub fn lease_all(
        clients: &[PageserverClient],
        tenant: TenantId,
        timeline: TimelineId,
        lsn: Lsn,
        holder: Option<&str>,
    ) -> Result<(), ApiError> {
        clients.iter().try_for_each(|c| c.lease(tenant, timeline, lsn, holder))
    }

    /// `GET …/basebackup?lsn={lsn}&full=true` (`lazy=true` instead for a
    /// lazy compute): a reader of the uncompressed tar stream, each read
    /// bounded by a timeout.
    pub fn basebackup(
        &self,
        tenant: TenantId,
        timeline: TimelineId,
        lsn: Lsn,
        kind: BasebackupKind,
        lazy: bool,
    ) -> Result<impl Read + Send + 'static, ApiError> {
        let url = format!(
            "{}/basebackup?lsn={}&{}{}",
            self.timeline_url(tenant, timeline),
            lsn_query(lsn),
            if lazy { "lazy=true" } else { "full=true" },
            match kind {
                BasebackupKind::Writer => "",
                BasebackupKind::ReadOnly => "&read_only=true",
                BasebackupKind::Standby => "&standby=true",
            }
        );
        let mut request = self.stream.get(&url);
        if let Some(auth) = self.authorization() {
            request = request.header("Authorization", auth);
        }
        let response = request.call().map_err(|e| transport_error(&url, e))?;
        let status = response.status().as_u16();
        if status != 200 {
            let text = response
                .into_body()
                .with_config()
                .limit(crate::limits::MAX_JSON_BYTES)
                .read_to_string()
                .unwrap_or_default();
            return Err(ApiError::Status { url, status, message: api_client::error_message(&text) });
        }
        Ok(response.into_body().into_reader())
    }
}

/// Which basebackup a compute starts from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BasebackupKind {
    /// A writer's, at the end of the ingested WAL.
    Writer,
    /// A read-only compute's, at any LSN.
    ReadOnly,
    /// A replica's: at the redo point of the last checkpoint record at or
    /// before the LSN, starting archive recovery (`docs/replicas.md`).
    Standby,
}

/// An LSN as a query parameter (`/` escaped).
fn lsn_query(lsn: Lsn) -> String {
    lsn.to_string().replace('/', "%2F")
}

fn transport_error(url: &str, e: ureq::Error) -> ApiError {
    ApiError::Unreachable { url: url.to_string(), message: e.to_string() }
}

/// Asks for the timeline until the pageserver answers, retrying transient
/// failures with backoff for at most `patience` of `clock`'s time.
pub async fn timeline_with_retry(
    client: &Arc<PageserverClient>,
    tenant: TenantId,
    timeline: TimelineId,
    patience: Duration,
    clock: &dyn Clock,
) -> Result<TimelineStatus, ApiError> {
    let deadline = clock.now() + patience;
    let mut backoff = crate::limits::PAGESERVER_FIRST_BACKOFF;
    loop {
        let asked = client.base();
        let c = client.clone();
        let result = tokio::task::spawn_blocking(move || c.timeline(tenant, timeline))
            .await
            .unwrap_or_else(|e| Err(ApiError::Invalid { url: client.base(), message: format!("request task: {e}") }));
        match result {
            Err(e) if e.is_transient() && clock.now() + backoff < deadline => {
                tracing::debug!("pageserver not answering yet: {e}");
                clock.sleep(backoff).await;
                backoff = (backoff * 2).min(crate::limits::PAGESERVER_MAX_BACKOFF);
            }
            // Not there: the tenant may have moved (a failover while the
            // agent was down, or during the request), and the controller
            // names its new place a moment later. Asked again there.
            Err(e) if e.status() == Some(404) && client.target.is_some() => {
                let until = deadline.min(clock.now() + crate::limits::PAGESERVER_MOVE_PATIENCE);
                while client.base() == asked && clock.now() < until {
                    clock.sleep(crate::limits::PAGESERVER_MOVE_POLL).await;
                }
                if client.base() == asked {
                    return Err(e);
                }
                tracing::info!(from = %asked, to = %client.base(), "the timeline was not where the agent asked: asking where the tenant is now");
            }
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_protocol::api::pageserver::TimelineState;

    #[test]
    fn parses_timeline_status() {
        let mut status = TimelineStatus::new(
            TenantId([1; 16]).into(),
            TimelineId([2; 16]),
            7412345678901234567,
            16 << 20,
            Lsn(0x16B3748),
        );
        let mut text = serde_json::to_value(&status).unwrap();
        assert_eq!(text["last_record_lsn"], "0/16B3748");
        assert_eq!(text["state"], "active");
        // A newer pageserver's answer, with a field this build does not know.
        text["ancestor"] = serde_json::Value::Null;
        let info: TimelineStatus = serde_json::from_value(text).unwrap();
        assert_eq!(info.system_id, 7412345678901234567);
        assert_eq!(info.last_record_lsn, Lsn(0x16B3748));
        assert_eq!(info.state, TimelineState::Active);
        assert_eq!(info.error, None);
        status.state = TimelineState::Broken;
        status.error = Some("layer file missing".into());
        let broken = serde_json::to_string(&status).unwrap();
        assert!(broken.contains(r#""state":"broken""#), "{broken}");
        let info: TimelineStatus = serde_json::from_str(&broken).unwrap();
        assert_eq!(info.error.as_deref(), Some("layer file missing"));
        assert!(serde_json::from_str::<TimelineStatus>(r#"{"system_id": 1}"#).is_err());
    }

    #[test]
    fn urls() {
        let c = PageserverClient::new("127.0.0.1:9898", None);
        let (t, l) = (TenantId([0x11; 16]), TimelineId([0x22; 16]));
        assert_eq!(
            c.timeline_url(t, l),
            format!("http://127.0.0.1:9898/v1/tenant/{}/timeline/{}", "11".repeat(16), "22".repeat(16))
        );
        assert_eq!(PageserverClient::new("http://ps:1/", None).base, "http://ps:1");
    }

    #[test]
    fn a_client_of_the_home_shard_follows_a_split() {
        use crate::pageserver_target::{PageserverTarget, TenantShards};
        use strata_protocol::api::controller::{AttachmentInfo, ShardAttachment};
        let (t, l) = (TenantId([0x11; 16]), TimelineId([0x22; 16]));
        let shards = TenantShards::unsharded(PageserverTarget::new("a:1".into(), None));
        let c = PageserverClient::new("a:1", None).following_home(shards.clone());
        assert_eq!(c.timeline_url(t, l), format!("http://a:1/v1/tenant/{t}/timeline/{l}"));
        let shard = |n: u8| ShardAttachment {
            shard: TenantShardId { tenant: t, shard: ShardIndex::new(n, 2).unwrap() },
            generation: 3,
            pageserver: format!("p{n}"),
            pg: format!("p{n}:2"),
            http: format!("p{n}:1"),
            reader: false,
        };
        let answer = AttachmentInfo {
            tenant_id: t.into(),
            version: 5,
            generation: 3,
            pageserver: "p0".into(),
            pg: "p0:2".into(),
            http: "p0:1".into(),
            reader: false,
            shards: vec![shard(0), shard(1)],
            stripe_blocks: Some(32),
        };
        shards.follow(&answer);
        let home = TenantShardId { tenant: t, shard: ShardIndex::new(0, 2).unwrap() };
        assert_eq!(c.timeline_url(t, l), format!("http://p0:1/v1/tenant/{home}/timeline/{l}"));
    }

    #[tokio::test]
    async fn unreachable_is_retried_then_reported() {
        // A port that was free a moment ago: connections are refused.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let client = Arc::new(PageserverClient::new(&format!("127.0.0.1:{port}"), None));
        let clock = strata_service::clock::SystemClock;
        let started = clock.now();
        let patience = Duration::from_millis(400);
        let err =
            timeline_with_retry(&client, TenantId([1; 16]), TimelineId([2; 16]), patience, &clock).await.unwrap_err();
        assert!(err.is_transient(), "{err}");
        let took = clock.since(started);
        assert!(took >= Duration::from_millis(150), "{took:?}");
        assert!(took < Duration::from_secs(5));
    }
}
