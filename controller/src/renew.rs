//! Renewal of the computes' tokens (`POST /v1/tenant/{tenant}/token`).
//!
//! A compute's agent holds a tenant token that expires; before it does, the
//! agent presents it here and gets the same claims (the same id, so that
//! revoking the token revokes its renewals) with a new expiry, signed by
//! this controller's issuer key. Every verifier takes that key for renewed
//! tenant tokens only ([`strata_service::auth`]): a controller's host can
//! never mint a management or service token, nor one that lasts.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use strata_protocol::api::controller::RenewedToken;
use strata_protocol::api::ErrorBody;
use strata_protocol::{TenantId, Token};
use strata_service::auth::{bearer_token, read_private, Scope, Signer, Verifier};

use crate::limits::RENEWED_TOKEN_TTL;

/// What renewing needs: the verifier the routes use, and the issuer key.
pub struct Renewer {
    pub verifier: Arc<Verifier>,
    /// The issuer's private key, read at every renewal (rare: one per
    /// compute per hour), so that a rotated key is used at once.
    pub issuer_key: PathBuf,
}

fn error(status: StatusCode, message: String) -> Response {
    (status, Json(ErrorBody { error: message })).into_response()
}

/// `POST /v1/tenant/{tenant}/token`, behind the tenant routes' guard
/// (which has checked that the caller's token allows the path's tenant).
pub async fn renew(
    State(renewer): State<Option<Arc<Renewer>>>,
    Path(tenant): Path<String>,
    headers: HeaderMap,
) -> Response {
    let Some(renewer) = renewer else {
        return error(StatusCode::NOT_FOUND, "this controller issues no tokens (no issuer_key in its config)".into());
    };
    let tenant: TenantId = match tenant.parse() {
        Ok(t) => t,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("{e}")),
    };
    let token = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(bearer_token).unwrap_or("");
    // The guard checked it already; the claims are read again to be copied.
    let claims = match renewer.verifier.verify(token) {
        Ok(c) => c,
        Err(refusal) => return error(StatusCode::UNAUTHORIZED, refusal.to_string()),
    };
    if claims.scope != Scope::Tenant || claims.tenant_id != Some(tenant) {
        return error(
            StatusCode::FORBIDDEN,
            format!("only a token of tenant {tenant} is renewed here, not a {} token", claims.scope),
        );
    }
    let issuer_key = renewer.issuer_key.clone();
    let signed = tokio::task::spawn_blocking(move || -> Result<(String, u64), String> {
        let pem = read_private(&issuer_key).map_err(|e| format!("{}: {e}", issuer_key.display()))?;
        let signer = Signer::from_pem(&pem, &issuer_key.display().to_string()).map_err(|e| e.to_string())?;
        let renewed = claims.renewed(lifetime(claims.iat, claims.exp));
        let exp = renewed.exp.unwrap_or_default();
        tracing::info!(%tenant, jti = renewed.jti.as_deref().unwrap_or("-"), exp, key = signer.key_id(), "renewed a compute's token");
        Ok((signer.sign(&renewed), exp))
    })
    .await;
    match signed {
        Ok(Ok((token, exp))) => Json(RenewedToken { token: Token::new(token), exp }).into_response(),
        Ok(Err(e)) => {
            tracing::error!("renewing a token: {e}");
            error(StatusCode::SERVICE_UNAVAILABLE, "the issuer key cannot be read".into())
        }
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// A renewal lasts as long as the token it renews was issued for, within
/// [`RENEWED_TOKEN_TTL`] when that was forever, and never beyond what an
/// issuer's key may sign.
fn lifetime(iat: u64, exp: Option<u64>) -> Duration {
    let secs = exp.map_or(RENEWED_TOKEN_TTL.as_secs(), |exp| exp.saturating_sub(iat).max(60));
    Duration::from_secs(secs).min(strata_service::limits::MAX_ISSUED_TTL)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_renewal_lasts_as_long_as_its_token_within_the_issuers_bound() {
        assert_eq!(lifetime(100, Some(3700)), Duration::from_secs(3600));
        assert_eq!(lifetime(100, None), RENEWED_TOKEN_TTL);
        assert_eq!(lifetime(100, Some(100)), Duration::from_secs(60));
        assert_eq!(lifetime(0, Some(u64::MAX)), strata_service::limits::MAX_ISSUED_TTL);
    }
}
