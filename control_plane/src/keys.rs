//! The cluster's key store (`auth/` in the workdir), made by `strata init`:
//!
//! - `private.pem` (0600): the Ed25519 key that signs every token; only the
//!   CLI reads it, to mint its own management token per command, each
//!   endpoint's tenant token and `strata auth token`'s;
//! - `public.pem`: what every service checks tokens against;
//! - `service.token` (0600): the services' own token, for calls between them;
//! - `controller.token` (0600): the storage controllers' token, which may
//!   also place tenants on pageservers (the services' may not).
//!
//! See `docs/security.md`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use strata_protocol::TenantId;
use strata_service::auth::{self, AuthConfig, Claims, Scope, Signer, Token};

use super::error::{Error, Result};
use crate::limits::CLI_TOKEN_TTL;

/// The key store's directory, relative to the workdir.
pub const AUTH_DIR: &str = "auth";

pub fn private_key(root: &Path) -> PathBuf {
    root.join(AUTH_DIR).join("private.pem")
}

pub fn public_key(root: &Path) -> PathBuf {
    root.join(AUTH_DIR).join("public.pem")
}

pub fn service_token(root: &Path) -> PathBuf {
    root.join(AUTH_DIR).join("service.token")
}

pub fn controller_token(root: &Path) -> PathBuf {
    root.join(AUTH_DIR).join("controller.token")
}

/// What a service's config says about tokens.
pub fn service_auth(root: &Path) -> AuthConfig {
    AuthConfig { public_key: public_key(root), token_file: Some(service_token(root)) }
}

/// What a storage controller's config says about tokens.
pub fn controller_auth(root: &Path) -> AuthConfig {
    AuthConfig { public_key: public_key(root), token_file: Some(controller_token(root)) }
}

/// Writes a new key pair and the services' token under `root`.
pub fn create(root: &Path) -> Result<()> {
    let dir = root.join(AUTH_DIR);
    std::fs::create_dir_all(&dir).map_err(|e| Error::Failed(format!("{}: {e}", dir.display())))?;
    let (private, public) = auth::generate_key_pair();
    auth::write_secret(&private_key(root), &private).map_err(|e| Error::Failed(e.to_string()))?;
    strata_service::durable::replace_file(&public_key(root), public.as_bytes(), true)
        .map_err(|e| Error::Failed(e.to_string()))?;
    let signer = Signer::from_pem(private.as_bytes(), "the new key").map_err(|e| Error::Failed(e.to_string()))?;
    for (scope, path) in [(Scope::Service, service_token(root)), (Scope::Controller, controller_token(root))] {
        let token = signer.sign(&Claims::new(scope, None, None));
        auth::write_secret(&path, &token).map_err(|e| Error::Failed(e.to_string()))?;
    }
    Ok(())
}

/// The signer of the cluster at `root`, if it has a key store (clusters
/// made before there were tokens have none, and their services accept
/// every caller).
pub fn signer(root: &Path) -> Result<Option<Signer>> {
    let path = private_key(root);
    if !path.exists() {
        return Ok(None);
    }
    // Refused when others may read it, as the services refuse their keys.
    let pem = auth::read_private(&path).map_err(|e| Error::Failed(format!("{}: {e}", path.display())))?;
    Signer::from_pem(&pem, &path.display().to_string()).map(Some).map_err(|e| Error::Failed(e.to_string()))
}

/// Makes every HTTP call of this process carry a fresh management token.
pub fn use_management_token(root: &Path) -> Result<()> {
    if let Some(signer) = signer(root)? {
        let token = signer.sign(&Claims::new(Scope::Management, None, Some(CLI_TOKEN_TTL)));
        super::http::use_token(Token::new(token));
    }
    Ok(())
}

/// How far a tenant token reaches within its tenant.
#[derive(Clone, Copy, Debug, Default)]
pub struct Bound {
    /// One timeline only; none: every timeline of the tenant.
    pub timeline: Option<strata_protocol::TimelineId>,
    /// Reading only: no proposing of WAL.
    pub read_only: bool,
}

/// A token of `scope` (`tenant` needs its tenant, and only it may be
/// bound) valid for `ttl` (forever if none).
pub fn mint(
    root: &Path,
    scope: Scope,
    tenant: Option<TenantId>,
    bound: Bound,
    ttl: Option<Duration>,
) -> Result<String> {
    match (scope, tenant) {
        (Scope::Tenant, None) => return Err(Error::Usage("a tenant token needs --tenant".into())),
        (Scope::Management | Scope::Controller | Scope::Service, Some(_)) => {
            return Err(Error::Usage(format!("a {scope} token is for every tenant: drop --tenant")))
        }
        (Scope::Management | Scope::Controller | Scope::Service, None)
            if bound.timeline.is_some() || bound.read_only =>
        {
            return Err(Error::Usage(format!(
                "only a tenant token is bound to a timeline or read-only, not a {scope} token"
            )))
        }
        _ => {}
    }
    let signer = signer(root)?.ok_or_else(|| {
        Error::Failed(format!("{}: no key store: this cluster does not use tokens", root.join(AUTH_DIR).display()))
    })?;
    let mut claims = Claims::new(scope, tenant, ttl);
    if let Some(timeline) = bound.timeline {
        claims = claims.for_timeline(timeline);
    }
    if bound.read_only {
        claims = claims.reading_only();
    }
    Ok(signer.sign(&claims))
}
