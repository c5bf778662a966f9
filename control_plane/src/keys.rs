//! The cluster's key store (`auth/` in the workdir), made by `strata init`:
//!
//! - `private.pem` (0600): the Ed25519 key that signs every token; only the
//!   CLI reads it, to mint its own management token per command, each
//!   endpoint's tenant token and `strata auth token`'s;
//! - `public.pem`: what every service checks tokens against;
//! - `service.token` (0600): the services' own token, for calls between them;
//! - `controller.token` (0600): the storage controllers' token, which may
//!   also place tenants on pageservers (the services' may not);
//! - `issuer.pem` (0600) and `issuer-public.pem`: the key with which the
//!   controllers renew the computes' tokens, which every verifier takes for
//!   renewed tenant tokens only;
//! - `revoked.json`: the deny list (`strata auth revoke`);
//! - `storage.key` (0600): the cluster's storage keys, which wrap the
//!   tenants' data keys (encryption at rest); only hosts that run a
//!   pageserver or a safekeeper get it.
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

/// The issuers' private key (the controllers renew the computes' tokens with it).
pub fn issuer_key(root: &Path) -> PathBuf {
    root.join(AUTH_DIR).join("issuer.pem")
}

/// The issuers' public keys.
pub fn issuer_public_key(root: &Path) -> PathBuf {
    auth::issuer_public_file(&public_key(root))
}

pub fn service_token(root: &Path) -> PathBuf {
    root.join(AUTH_DIR).join("service.token")
}

pub fn controller_token(root: &Path) -> PathBuf {
    root.join(AUTH_DIR).join("controller.token")
}

/// The cluster's storage key file.
pub fn storage_key(root: &Path) -> PathBuf {
    root.join(AUTH_DIR).join("storage.key")
}

/// Writes a new storage key file (one random key) under `root`.
pub fn create_storage_key(root: &Path) -> Result<()> {
    let text = strata_remote_storage::seal::keys::ClusterKeys::new_file_text();
    auth::write_secret(&storage_key(root), &text).map_err(failed)
}

/// What a service's config says about tokens.
pub fn service_auth(root: &Path) -> AuthConfig {
    AuthConfig { public_key: public_key(root), token_file: Some(service_token(root)), audit_log: None }
}

/// What a storage controller's config says about tokens.
pub fn controller_auth(root: &Path) -> AuthConfig {
    AuthConfig { public_key: public_key(root), token_file: Some(controller_token(root)), audit_log: None }
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
    let (issuer_private, issuer_public) = auth::generate_key_pair();
    auth::write_secret(&issuer_key(root), &issuer_private).map_err(failed)?;
    strata_service::durable::replace_file(&issuer_public_key(root), issuer_public.as_bytes(), true).map_err(failed)?;
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
/// A process that runs longer than the token (the proxy, the console)
/// gets a new one at the first opening of the workdir past half its life.
pub fn use_management_token(root: &Path) -> Result<()> {
    super::http::use_minted_token(CLI_TOKEN_TTL / 2, || {
        let signer = signer(root).map_err(|e| e.to_string())?;
        Ok(signer.map(|s| Token::new(s.sign(&Claims::new(Scope::Management, None, Some(CLI_TOKEN_TTL))))))
    })
    .map_err(Error::Failed)
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

/// The deny list's file (`docs/security.md`, "Revoking a token").
pub fn revoked_file(root: &Path) -> PathBuf {
    auth::revoked_file(&public_key(root))
}

fn failed(e: impl std::fmt::Display) -> Error {
    Error::Failed(e.to_string())
}

/// One of the two kinds of key that rotate: the cluster's (signs every
/// token) and the issuers' (renew the computes' tokens).
#[derive(Clone, Copy)]
struct KeyKind {
    private: fn(&Path) -> PathBuf,
    public: fn(&Path) -> PathBuf,
}

const KINDS: [KeyKind; 2] =
    [KeyKind { private: private_key, public: public_key }, KeyKind { private: issuer_key, public: issuer_public_key }];

/// Where a kind's new private key waits until it signs.
fn staged(kind: KeyKind, root: &Path) -> PathBuf {
    let path = (kind.private)(root);
    path.with_extension("pem.new")
}

/// The public keys of a kind trusted now, as PEM blocks, newest first
/// (none when its file is missing: clusters from before issuers).
fn trusted_pems(path: &Path) -> Result<Vec<String>> {
    if !path.exists() {
        return Ok(Vec::new());
    }
    let text = std::fs::read_to_string(path).map_err(|e| Error::Failed(format!("{}: {e}", path.display())))?;
    // Only a valid key file is rewritten.
    let keys = auth::keys::parse(text.as_bytes(), &path.display().to_string()).map_err(failed)?;
    Ok(keys.into_iter().map(|k| k.pem).collect())
}

/// The ids of the cluster's keys and of the issuers' trusted now, newest first.
pub fn trusted_key_ids(root: &Path) -> Result<(Vec<String>, Vec<String>)> {
    let verifier = strata_service::auth::Verifier::load(&public_key(root)).map_err(failed)?;
    Ok((verifier.key_ids(), verifier.issuer_key_ids()))
}

/// The id of the key in private key file `path`, if there is one.
pub fn key_id_of(path: &Path) -> Result<Option<String>> {
    if !path.exists() {
        return Ok(None);
    }
    let pem = auth::read_private(path).map_err(|e| Error::Failed(format!("{}: {e}", path.display())))?;
    auth::keys::private_key_id(&pem, &path.display().to_string()).map(Some).map_err(failed)
}

/// The first step of a rotation: a new pair of each kind is made and its
/// public half trusted beside the old one (newest first). Nothing is signed
/// with them yet, so that every host trusts them before it meets a token
/// they signed. Returns the new cluster key's id. Refused while a rotation
/// is under way.
pub fn stage_new_keys(root: &Path) -> Result<String> {
    let trusted = trusted_pems(&public_key(root))?;
    if trusted.len() > 1 {
        return Err(Error::Usage(format!(
            "{} keys are trusted already: a rotation is under way; finish it with `strata auth rotate --retire`",
            trusted.len()
        )));
    }
    let mut new_kid = String::new();
    for (i, kind) in KINDS.into_iter().enumerate() {
        let (private, public) = auth::generate_key_pair();
        auth::write_secret(&staged(kind, root), &private).map_err(failed)?;
        let text = format!("{public}{}", trusted_pems(&(kind.public)(root))?.concat());
        strata_service::durable::replace_file(&(kind.public)(root), text.as_bytes(), true).map_err(failed)?;
        if i == 0 {
            new_kid = auth::keys::private_key_id(private.as_bytes(), "the new key").map_err(failed)?;
        }
    }
    Ok(new_kid)
}

/// The second step: the staged keys sign from now on, and the services'
/// and controllers' tokens are signed again (each process reads its token
/// file again when it changes; the agents renew theirs at the controllers,
/// whose issuer key is read at each renewal). Tokens signed by the old keys
/// stay valid until they are retired.
pub fn switch_to_new_keys(root: &Path) -> Result<()> {
    for kind in KINDS {
        let staged = staged(kind, root);
        let Some(kid) = key_id_of(&staged)? else {
            return Err(Error::Failed(format!("{}: no staged key: run `strata auth rotate` again", staged.display())));
        };
        let trusted = strata_service::auth::Verifier::load(&public_key(root)).map_err(failed)?;
        if !trusted.is_newest(&kid) {
            return Err(Error::Failed(format!("{}: its key is not the newest trusted one", staged.display())));
        }
        let to = (kind.private)(root);
        std::fs::rename(&staged, &to)
            .map_err(|e| Error::Failed(format!("{} to {}: {e}", staged.display(), to.display())))?;
    }
    strata_service::durable::sync_dir(&root.join(AUTH_DIR)).map_err(failed)?;
    let signer = signer(root)?.ok_or_else(|| Error::Failed("no key store".into()))?;
    for (scope, path) in [(Scope::Service, service_token(root)), (Scope::Controller, controller_token(root))] {
        auth::write_secret(&path, &signer.sign(&Claims::new(scope, None, None))).map_err(failed)?;
    }
    Ok(())
}

/// The last step: only the keys that sign now stay trusted; every token
/// signed by another is refused from then on. Returns the retired ids.
pub fn retire_old_keys(root: &Path) -> Result<Vec<String>> {
    let mut retired = Vec::new();
    for kind in KINDS {
        let Some(signing) = key_id_of(&(kind.private)(root))? else { continue };
        let mut keep = None;
        for block in trusted_pems(&(kind.public)(root))? {
            let kid = auth::keys::parse(block.as_bytes(), "key").map_err(failed)?.remove(0).kid;
            match kid == signing {
                true => keep = Some(block),
                false => retired.push(kid),
            }
        }
        let path = (kind.public)(root);
        let keep = keep.ok_or_else(|| {
            Error::Failed(format!("the signing key {signing} is not among those {} trusts", path.display()))
        })?;
        strata_service::durable::replace_file(&path, keep.as_bytes(), true).map_err(failed)?;
    }
    Ok(retired)
}

/// Puts token `jti` (which expires at `until`, if it does) on the deny
/// list; entries of tokens expired since are dropped.
pub fn revoke(root: &Path, jti: &str, until: Option<u64>) -> Result<usize> {
    let path = revoked_file(root);
    let mut list = match path.exists() {
        true => {
            let bytes = std::fs::read(&path).map_err(|e| Error::Failed(format!("{}: {e}", path.display())))?;
            auth::DenyList::parse(&bytes).map_err(|e| Error::Failed(format!("{}: {e}", path.display())))?
        }
        false => auth::DenyList::default(),
    };
    list.revoke(jti, until, auth::now()).map_err(Error::Usage)?;
    strata_service::durable::replace_file(&path, list.to_json().as_bytes(), true).map_err(failed)?;
    Ok(list.len())
}

/// The id and expiry of the token in `path`, checked against the keys the
/// cluster trusts (an expired token is refused by every service already).
pub fn token_id(root: &Path, path: &Path) -> Result<(String, Option<u64>)> {
    let token = auth::read_token(path).map_err(failed)?;
    let verifier = strata_service::auth::Verifier::load(&public_key(root)).map_err(failed)?;
    let claims = verifier.verify(&token.expose()).map_err(|refusal| {
        Error::Usage(format!("{}: {refusal}: no service accepts it, there is nothing to revoke", path.display()))
    })?;
    let jti = claims.jti.ok_or_else(|| {
        Error::Usage(format!(
            "{}: a token from before token ids: only retiring its key revokes it (strata auth rotate)",
            path.display()
        ))
    })?;
    // A tenant token may have been renewed (same id, later expiry): its
    // entry stays until the key is retired.
    let until = if claims.scope == Scope::Tenant { None } else { claims.exp };
    Ok((jti, until))
}
