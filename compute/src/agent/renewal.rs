//! Keeps the agent's token alive: before it expires (a third of its life
//! left), or once a newer key is trusted (a rotation under way), the agent
//! presents it to a storage controller, which issues it again
//! (`POST /v1/tenant/{tenant}/token`, `docs/security.md`, "Renewal"). The
//! renewal replaces the token every client of the agent holds, its file,
//! and a replica's password file, which the walreceiver reads at its next
//! connection.

use std::path::PathBuf;
use std::sync::Arc;

use strata_protocol::api::compute::TokenStatus;
use strata_protocol::api::controller::RenewedToken;
use strata_protocol::{TenantId, Token};
use strata_service::api_client::ApiClient;
use strata_service::auth::{unverified_lifetime, write_secret, Lifetime, Verifier};
use strata_service::tls::ClientTls;

use crate::limits::{TOKEN_CHECK_INTERVAL, TOKEN_RENEW_TIMEOUT};

/// What the renewal task needs.
pub struct Renewal {
    pub token: Token,
    pub token_file: Option<PathBuf>,
    pub controllers: Vec<String>,
    pub tenant: TenantId,
    pub tls: Option<ClientTls>,
    /// The keys trusted now, to see a rotation under way; none: only expiry.
    pub verifier: Option<Arc<Verifier>>,
    /// A replica's data directory, whose password file holds the token.
    pub replica_pgdata: Option<PathBuf>,
    pub clock: crate::clock::SharedClock,
}

/// Whether a token of `life` is renewed at `now`: a third of its life or
/// less is left, or its key is no longer the newest trusted.
pub fn due(life: &Lifetime, now: u64, newest_key: bool) -> bool {
    let expiring = life.exp.is_some_and(|exp| {
        let whole = exp.saturating_sub(life.iat);
        exp.saturating_sub(now) <= whole / 3
    });
    expiring || !newest_key
}

impl Renewal {
    /// Runs until aborted, reporting each change through `report`.
    pub async fn run(self, report: impl Fn(TokenStatus) + Send + 'static) {
        if self.controllers.is_empty() {
            return;
        }
        let client = ApiClient::new(self.tls.as_ref(), None, TOKEN_RENEW_TIMEOUT);
        let mut status = TokenStatus::default();
        let mut next = 0usize;
        loop {
            let current = self.token.expose();
            let life = unverified_lifetime(&current);
            status.kid = life.as_ref().and_then(|l| l.kid.clone());
            status.exp = life.as_ref().and_then(|l| l.exp);
            let newest = match (&self.verifier, &status.kid) {
                (Some(v), Some(kid)) => v.is_newest(kid),
                _ => true,
            };
            let now = self.clock.system_now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
            if life.as_ref().is_some_and(|l| due(l, now, newest)) {
                match self.renew(&client, &mut next).await {
                    Ok(renewed) => {
                        status.renewals += 1;
                        status.last_error = None;
                        let life = unverified_lifetime(&renewed.token.expose());
                        status.kid = life.as_ref().and_then(|l| l.kid.clone());
                        status.exp = Some(renewed.exp);
                        tracing::info!(exp = renewed.exp, kid = status.kid.as_deref().unwrap_or("-"), "token renewed");
                    }
                    Err(e) => {
                        tracing::warn!("renewing the token: {e}");
                        status.last_error = Some(e);
                    }
                }
            }
            report(status.clone());
            self.clock.sleep(TOKEN_CHECK_INTERVAL).await;
        }
    }

    /// Asks each controller in turn, from the one that answered last.
    async fn renew(&self, client: &ApiClient, next: &mut usize) -> Result<RenewedToken, String> {
        let mut errors = Vec::new();
        for _ in 0..self.controllers.len() {
            let controller = &self.controllers[*next % self.controllers.len()];
            let url = client.url(controller, &format!("/v1/tenant/{}/token", self.tenant));
            let (c, u) = (client.clone().with_token(Some(self.token.clone())), url.clone());
            let answer = tokio::task::spawn_blocking(move || {
                c.send("POST", &u, None::<&()>).and_then(|r| r.into_result::<RenewedToken>())
            })
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r.map_err(|e| e.to_string()));
            match answer {
                Ok(renewed) => {
                    self.take(&renewed.token)?;
                    return Ok(renewed);
                }
                Err(e) => {
                    errors.push(format!("{controller}: {e}"));
                    *next += 1;
                }
            }
        }
        Err(errors.join("; "))
    }

    /// Makes `renewed` the token of every client, of its file and of a
    /// replica's password file.
    fn take(&self, renewed: &Token) -> Result<(), String> {
        let text = renewed.expose();
        if let Some(path) = &self.token_file {
            write_secret(path, &text).map_err(|e| format!("{}: {e}", path.display()))?;
        }
        if let Some(pgdata) = &self.replica_pgdata {
            super::pgconf::rewrite_replication_password(pgdata, &text).map_err(|e| e.to_string())?;
        }
        self.token.replace(text.to_string());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_service::auth::{generate_key_pair, Claims, Scope, Signer};

    #[test]
    fn a_token_is_renewed_with_a_third_of_its_life_left_or_once_its_key_is_old() {
        let signer = Signer::from_pem(generate_key_pair().0.as_bytes(), "test").unwrap();
        let mut claims = Claims::new(Scope::Tenant, Some(TenantId([1; 16])), None);
        (claims.iat, claims.exp) = (1000, Some(4000));
        let life = unverified_lifetime(&signer.sign(&claims)).unwrap();
        assert_eq!(life, Lifetime { kid: Some(signer.key_id().to_string()), iat: 1000, exp: Some(4000) });
        assert!(!due(&life, 2000, true));
        assert!(!due(&life, 2999, true));
        assert!(due(&life, 3000, true));
        assert!(due(&life, 5000, true));
        assert!(due(&life, 1000, false), "a rotation under way");
        claims.exp = None;
        let forever = unverified_lifetime(&signer.sign(&claims)).unwrap();
        assert!(!due(&forever, u64::MAX, true));
        for bad in ["", "x", "a.b", "a.b.c", &"a".repeat(5000)] {
            assert_eq!(unverified_lifetime(bad), None, "{bad}");
        }
    }
}
