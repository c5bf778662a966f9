//! Who may call what: tokens signed with the cluster's Ed25519 key (JWT,
//! algorithm `EdDSA`), each with one scope. `docs/security.md` has the
//! token format and which interface accepts which scope.
//!
//! - **management**: the operator and the CLI; every call.
//! - **service**: one service calling another (WAL streaming, peers'
//!   positions, status and metrics); every tenant's data, no management.
//! - **tenant**: one tenant's computes; that tenant's data only.
//!
//! Services hold only the public key, so a stolen service config cannot
//! mint tokens; whoever holds the private key (the key store that
//! `strata init` writes) can.

pub mod http;
pub mod keys;
pub mod revoked;

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};
use strata_protocol::{TenantId, TimelineId};

pub use keys::KeyError;
pub use revoked::DenyList;

use crate::limits::{AUTH_RELOAD_INTERVAL, LEEWAY_SECS, MAX_ISSUED_TTL, MAX_TOKEN_LEN, MAX_TRUST_FILE_BYTES};

/// What a token lets its holder do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    Management,
    /// The storage controllers: what a service may do, and placing tenants
    /// on pageservers (attach, detach, secondary).
    Controller,
    Service,
    Tenant,
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Scope::Management => "management",
            Scope::Controller => "controller",
            Scope::Service => "service",
            Scope::Tenant => "tenant",
        })
    }
}

impl std::str::FromStr for Scope {
    type Err = String;
    fn from_str(s: &str) -> Result<Scope, String> {
        match s {
            "management" => Ok(Scope::Management),
            "controller" => Ok(Scope::Controller),
            "service" => Ok(Scope::Service),
            "tenant" => Ok(Scope::Tenant),
            _ => Err(format!("{s:?} is not a scope (management, controller, service, tenant)")),
        }
    }
}

/// The claims of a token.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    pub scope: Scope,
    /// The tenant of a `tenant` token (and only of one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant_id: Option<TenantId>,
    /// The one timeline of its tenant a `tenant` token is for; none: all of
    /// them (only of a `tenant` token).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline_id: Option<TimelineId>,
    /// A `tenant` token that may read only (a replica's, a read-only
    /// endpoint's): it may not propose WAL (only of a `tenant` token).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub read_only: bool,
    /// Issued at, seconds since the epoch.
    pub iat: u64,
    /// Expires at, seconds since the epoch; none for the services' own
    /// tokens, which live as long as the key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exp: Option<u64>,
    /// The token's id, random, by which it is revoked (none in tokens from
    /// before ids, which only a key's rotation revokes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jti: Option<String>,
}

impl Claims {
    /// Claims of `scope` issued now, valid for `ttl` (forever if none).
    pub fn new(scope: Scope, tenant_id: Option<TenantId>, ttl: Option<std::time::Duration>) -> Claims {
        let iat = now();
        let exp = ttl.map(|t| iat.saturating_add(t.as_secs().max(1)));
        Claims { scope, tenant_id, timeline_id: None, read_only: false, iat, exp, jti: Some(new_token_id()) }
    }

    /// The same claims issued again now, for `ttl` (a renewal): the same
    /// id, so that revoking a token revokes its renewals.
    pub fn renewed(&self, ttl: std::time::Duration) -> Claims {
        let iat = now();
        Claims { iat, exp: Some(iat.saturating_add(ttl.as_secs().max(1))), ..self.clone() }
    }

    /// These claims for `timeline` of their tenant only.
    pub fn for_timeline(self, timeline: TimelineId) -> Claims {
        Claims { timeline_id: Some(timeline), ..self }
    }

    /// These claims without the right to propose WAL.
    pub fn reading_only(self) -> Claims {
        Claims { read_only: true, ..self }
    }

    /// Whether these claims allow `need`; the refusal if not.
    pub fn permits(&self, need: Access) -> Result<(), Refusal> {
        match (self.scope, need) {
            (Scope::Management, _) => Ok(()),
            (Scope::Controller, Access::Placement | Access::Service | Access::Tenant(_) | Access::Timeline(..)) => {
                Ok(())
            }
            (Scope::Service, Access::Service | Access::Tenant(_) | Access::Timeline(..)) => Ok(()),
            (Scope::Tenant, Access::Tenant(t) | Access::Timeline(t, _) | Access::Propose(t, _))
                if self.tenant_id != Some(t) =>
            {
                Err(Refusal::OtherTenant)
            }
            (Scope::Tenant, Access::Tenant(_)) => Ok(()),
            (Scope::Tenant, Access::Timeline(_, timeline)) => self.check_timeline(timeline),
            (Scope::Tenant, Access::Propose(_, timeline)) => {
                self.check_timeline(timeline)?;
                match self.read_only {
                    true => Err(Refusal::ReadOnly),
                    false => Ok(()),
                }
            }
            (have, need) => Err(Refusal::Scope { have, need: need.scope() }),
        }
    }

    fn check_timeline(&self, timeline: TimelineId) -> Result<(), Refusal> {
        match self.timeline_id {
            Some(mine) if mine != timeline => Err(Refusal::OtherTimeline),
            _ => Ok(()),
        }
    }
}

/// When a token was issued, when it expires, and the key that signed it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lifetime {
    pub kid: Option<String>,
    pub iat: u64,
    pub exp: Option<u64>,
}

/// A token's [`Lifetime`], read without checking its signature: for a
/// holder to see when its own token is due for renewal (whoever it is shown
/// to checks it). None for what is not a token.
pub fn unverified_lifetime(token: &str) -> Option<Lifetime> {
    if token.len() > MAX_TOKEN_LEN {
        return None;
    }
    let header = jsonwebtoken::decode_header(token).ok()?;
    let claims = jsonwebtoken::dangerous::insecure_decode::<Claims>(token).ok()?.claims;
    Some(Lifetime { kid: header.kid, iat: claims.iat, exp: claims.exp })
}

/// A new token id: 16 random bytes in hex.
pub fn new_token_id() -> String {
    let mut bytes = [0u8; 16];
    rustls::crypto::aws_lc_rs::default_provider()
        .secure_random
        .fill(&mut bytes)
        .expect("the system's random source works");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Seconds since the epoch now.
pub fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// What a call needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Management only.
    Management,
    /// Placing a tenant on a pageserver: a controller (or management).
    Placement,
    /// A service (or a controller, or management).
    Service,
    /// What a tenant as a whole shows its computes (where it is attached):
    /// a token of that tenant (of any of its timelines), a service, a
    /// controller or management.
    Tenant(TenantId),
    /// Reading one timeline (pages, basebackups, WAL): a token of its
    /// tenant for every timeline or for this one, a service, a controller
    /// or management.
    Timeline(TenantId, TimelineId),
    /// Proposing WAL on one timeline (a writer): a token of its tenant that
    /// may write, for every timeline or for this one, or management.
    Propose(TenantId, TimelineId),
}

/// Who `claims` say the caller is, for the audit log; nobody for a token
/// that did not verify.
pub fn identity(claims: Option<&Claims>) -> crate::audit::Identity {
    match claims {
        None => crate::audit::Identity::default(),
        Some(c) => crate::audit::Identity {
            scope: Some(c.scope.to_string()),
            tenant_id: c.tenant_id.map(|t| t.to_string()),
            timeline_id: c.timeline_id.map(|t| t.to_string()),
            jti: c.jti.clone(),
            user: None,
        },
    }
}

/// What was asked, as the audit log names it.
impl fmt::Display for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Access::Management => f.write_str("management"),
            Access::Placement => f.write_str("placement"),
            Access::Service => f.write_str("service"),
            Access::Tenant(t) => write!(f, "tenant {t}"),
            Access::Timeline(t, l) => write!(f, "read {t}/{l}"),
            Access::Propose(t, l) => write!(f, "propose {t}/{l}"),
        }
    }
}

impl Access {
    /// The narrowest scope that is allowed.
    pub fn scope(self) -> Scope {
        match self {
            Access::Management => Scope::Management,
            Access::Placement => Scope::Controller,
            Access::Service => Scope::Service,
            Access::Tenant(_) | Access::Timeline(..) | Access::Propose(..) => Scope::Tenant,
        }
    }
}

/// Why a call was refused. The first six mean "who are you?" (HTTP 401),
/// the others "not you" (403).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("no token: this interface needs a bearer token")]
    NoToken,
    #[error("a malformed token: {0}")]
    Malformed(String),
    #[error("a token not signed by this cluster's key")]
    BadSignature,
    #[error("an expired token")]
    Expired,
    #[error("a token signed by a key this cluster no longer trusts (or never did)")]
    UnknownKey,
    #[error("a revoked token")]
    Revoked,
    #[error("a {have} token cannot do this: it needs {need} scope")]
    Scope { have: Scope, need: Scope },
    #[error("a token of another tenant")]
    OtherTenant,
    #[error("a token of another timeline")]
    OtherTimeline,
    #[error("a read-only token cannot propose WAL")]
    ReadOnly,
}

impl Refusal {
    /// Whether this is "who are you?" (401) rather than "not you" (403).
    pub fn unauthenticated(&self) -> bool {
        !matches!(self, Refusal::Scope { .. } | Refusal::OtherTenant | Refusal::OtherTimeline | Refusal::ReadOnly)
    }

    /// A short label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::NoToken => "no_token",
            Refusal::Malformed(_) => "malformed",
            Refusal::BadSignature => "bad_signature",
            Refusal::Expired => "expired",
            Refusal::UnknownKey => "unknown_key",
            Refusal::Revoked => "revoked",
            Refusal::Scope { .. } => "scope",
            Refusal::OtherTenant => "other_tenant",
            Refusal::OtherTimeline => "other_timeline",
            Refusal::ReadOnly => "read_only",
        }
    }
}

pub use strata_protocol::Token;

fn read(path: &Path) -> Result<Vec<u8>, KeyError> {
    std::fs::read(path).map_err(|source| KeyError::Io { path: path.to_path_buf(), source })
}

/// A secret's file that its group or others may access: what it holds can
/// no longer be trusted to be secret.
#[derive(Debug, thiserror::Error)]
#[error(
    "mode {mode:04o} gives group or others access to a key or token; it must be private to its owner: chmod 600 {}",
    path.display()
)]
pub struct Exposed {
    /// The file.
    pub path: PathBuf,
    /// Its permission bits.
    pub mode: u32,
}

/// The contents of a file holding a secret (a token, a private key); like
/// PostgreSQL with its server key, refused (an [`Exposed`] inside the
/// error) when group or others have any access to it. The mode checked is
/// that of the file opened, so a name swapped meanwhile cannot slip by.
pub fn read_private(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::PermissionsExt;
    let mut file = std::fs::File::open(path)?;
    let mode = file.metadata()?.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(std::io::Error::other(Exposed { path: path.to_path_buf(), mode }));
    }
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Checks tokens against the keys the cluster trusts and its deny list.
///
/// Loaded from a key file, it reads that file again when it changes, and
/// the issuers' keys and the deny list beside it ([`ISSUER_PUBLIC_FILE`],
/// [`REVOKED_FILE`]): a key rotates and a token is revoked with no restart.
/// It looks at most once per [`AUTH_RELOAD_INTERVAL`]; a file that changed
/// into something unreadable is logged and the last good contents kept.
pub struct Verifier {
    trust: parking_lot::RwLock<Trust>,
    files: Option<TrustFiles>,
    validation: Validation,
}

/// What a verifier trusts now.
#[derive(Default)]
struct Trust {
    /// Keys that sign any token (the cluster's), newest first.
    keys: Vec<keys::TrustedKey>,
    /// Keys that sign only renewed tenant tokens (the controllers'), newest first.
    issuers: Vec<keys::TrustedKey>,
    revoked: DenyList,
}

/// The three files of a verifier's trust.
#[derive(Clone, Copy, PartialEq, Eq)]
enum TrustFile {
    Keys,
    Issuers,
    Revoked,
}

/// Where a verifier's trust comes from, and what it last saw there.
struct TrustFiles {
    key_file: PathBuf,
    seen: parking_lot::Mutex<Seen>,
}

struct Seen {
    checked: std::time::Instant,
    stamps: [Option<FileStamp>; 3],
}

/// What tells a file changed without reading it.
#[derive(Clone, Copy, PartialEq, Eq)]
struct FileStamp {
    modified: Option<SystemTime>,
    len: u64,
    inode: u64,
}

fn stamp(path: &Path) -> Option<FileStamp> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some(FileStamp { modified: m.modified().ok(), len: m.len(), inode: m.ino() })
}

/// A trust file's contents, bounded.
fn read_trust_file(path: &Path) -> Result<Vec<u8>, KeyError> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(|source| KeyError::Io { path: path.to_path_buf(), source })?;
    let mut bytes = Vec::new();
    file.take(MAX_TRUST_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|source| KeyError::Io { path: path.to_path_buf(), source })?;
    if bytes.len() as u64 > MAX_TRUST_FILE_BYTES {
        return Err(KeyError::Token {
            path: path.to_path_buf(),
            message: format!("over {MAX_TRUST_FILE_BYTES} bytes"),
        });
    }
    Ok(bytes)
}

/// The deny list's file beside key file `public_key`.
pub fn revoked_file(public_key: &Path) -> PathBuf {
    public_key.with_file_name(REVOKED_FILE)
}

/// The issuers' keys' file beside key file `public_key`.
pub fn issuer_public_file(public_key: &Path) -> PathBuf {
    public_key.with_file_name(ISSUER_PUBLIC_FILE)
}

/// The name of the deny list's file, beside the key file.
pub const REVOKED_FILE: &str = "revoked.json";

/// The name of the file of the issuers' public keys, beside the key file:
/// keys that sign only tenant tokens that expire within
/// [`MAX_ISSUED_TTL`](crate::limits::MAX_ISSUED_TTL) (the controllers',
/// which renew the computes' tokens).
pub const ISSUER_PUBLIC_FILE: &str = "issuer-public.pem";

impl TrustFiles {
    fn path(&self, which: TrustFile) -> PathBuf {
        match which {
            TrustFile::Keys => self.key_file.clone(),
            TrustFile::Issuers => issuer_public_file(&self.key_file),
            TrustFile::Revoked => revoked_file(&self.key_file),
        }
    }

    /// Reads one file into `trust`; an optional file that is not there is empty.
    fn read(&self, which: TrustFile, trust: &mut Trust) -> Result<(), KeyError> {
        let path = self.path(which);
        if which != TrustFile::Keys && !path.exists() {
            match which {
                TrustFile::Issuers => trust.issuers.clear(),
                _ => trust.revoked = DenyList::default(),
            }
            return Ok(());
        }
        let bytes = read_trust_file(&path)?;
        let what = path.display().to_string();
        match which {
            TrustFile::Keys => trust.keys = keys::parse(&bytes, &what)?,
            TrustFile::Issuers => trust.issuers = keys::parse(&bytes, &what)?,
            TrustFile::Revoked => {
                trust.revoked =
                    DenyList::parse(&bytes).map_err(|message| KeyError::Token { path: path.clone(), message })?
            }
        }
        Ok(())
    }
}

const TRUST_FILES: [TrustFile; 3] = [TrustFile::Keys, TrustFile::Issuers, TrustFile::Revoked];

impl Verifier {
    fn with(trust: Trust, files: Option<TrustFiles>) -> Verifier {
        let mut validation = Validation::new(Algorithm::EdDSA);
        // `exp` is checked when present; services' own tokens have none.
        validation.required_spec_claims.clear();
        validation.validate_exp = true;
        validation.leeway = LEEWAY_SECS;
        Verifier { trust: parking_lot::RwLock::new(trust), files, validation }
    }

    /// From public keys in PEM (`-----BEGIN PUBLIC KEY-----`, one or more),
    /// fixed: no file is watched, no issuer trusted and nothing revoked.
    pub fn from_pem(pem: &[u8], what: &str) -> Result<Verifier, KeyError> {
        Ok(Verifier::with(Trust { keys: keys::parse(pem, what)?, ..Trust::default() }, None))
    }

    /// From a key file and the issuers' keys and deny list beside it (if
    /// there are), all read again when they change.
    pub fn load(path: &Path) -> Result<Verifier, KeyError> {
        let files = TrustFiles {
            key_file: path.to_path_buf(),
            seen: parking_lot::Mutex::new(Seen { checked: std::time::Instant::now(), stamps: [None; 3] }),
        };
        let mut trust = Trust::default();
        {
            let mut seen = files.seen.lock();
            for (i, which) in TRUST_FILES.into_iter().enumerate() {
                seen.stamps[i] = stamp(&files.path(which));
                files.read(which, &mut trust)?;
            }
        }
        Ok(Verifier::with(trust, Some(files)))
    }

    /// The ids of the keys trusted now, in the key file's order.
    pub fn key_ids(&self) -> Vec<String> {
        self.refresh();
        self.trust.read().keys.iter().map(|k| k.kid.clone()).collect()
    }

    /// The ids of the issuers' keys trusted now, in their file's order.
    pub fn issuer_key_ids(&self) -> Vec<String> {
        self.refresh();
        self.trust.read().issuers.iter().map(|k| k.kid.clone()).collect()
    }

    /// Whether `kid` is the newest key of its kind (the first of its file):
    /// a token signed by another is renewed before its key is retired.
    pub fn is_newest(&self, kid: &str) -> bool {
        self.refresh();
        let trust = self.trust.read();
        [&trust.keys, &trust.issuers].iter().any(|keys| keys.first().is_some_and(|k| k.kid == kid))
    }

    /// Reads a trust file again if it changed since it last looked (at
    /// most once per [`AUTH_RELOAD_INTERVAL`]).
    fn refresh(&self) {
        let Some(files) = &self.files else { return };
        let Some(mut seen) = files.seen.try_lock() else { return };
        if seen.checked.elapsed() < AUTH_RELOAD_INTERVAL {
            return;
        }
        seen.checked = std::time::Instant::now();
        for (i, which) in TRUST_FILES.into_iter().enumerate() {
            let path = files.path(which);
            let now = stamp(&path);
            if now == seen.stamps[i] {
                continue;
            }
            seen.stamps[i] = now;
            let mut trust = self.trust.write();
            match files.read(which, &mut trust) {
                Ok(()) => tracing::info!(
                    file = %path.display(),
                    keys = ?trust.keys.iter().map(|k| k.kid.as_str()).collect::<Vec<_>>(),
                    issuers = ?trust.issuers.iter().map(|k| k.kid.as_str()).collect::<Vec<_>>(),
                    revoked = trust.revoked.len(),
                    "trust read again"
                ),
                Err(e) => tracing::error!("{e}; what was read before stays"),
            }
        }
    }

    /// [`Verifier::check`] on `interface` for `action` (what was asked, for
    /// the audit log), giving the claims: a refusal goes to the audit log
    /// with whoever the token says (if it verified), and so does a session
    /// that proposes WAL.
    pub fn check_for(&self, interface: &str, action: &str, token: &str, need: Access) -> Result<Claims, Refusal> {
        let verified = self.verify(token);
        let outcome = verified.clone().and_then(|claims| claims.permits(need).map(|()| claims));
        match &outcome {
            Err(refusal) => {
                crate::audit::refused(interface, action, refusal.reason(), identity(verified.as_ref().ok()))
            }
            Ok(claims) if matches!(need, Access::Propose(..)) => {
                crate::audit::allowed(interface, action, identity(Some(claims)))
            }
            Ok(_) => {}
        }
        outcome
    }

    /// Whether `token` is valid and allows `need`; the refusal if not.
    pub fn check(&self, token: &str, need: Access) -> Result<(), Refusal> {
        self.verify(token).and_then(|claims| claims.permits(need))
    }

    /// The claims of `token` if a trusted key signed it, it has not expired
    /// and it is not revoked.
    pub fn verify(&self, token: &str) -> Result<Claims, Refusal> {
        if token.is_empty() {
            return Err(Refusal::NoToken);
        }
        if token.len() > MAX_TOKEN_LEN {
            return Err(Refusal::Malformed(format!("longer than {MAX_TOKEN_LEN} bytes")));
        }
        self.refresh();
        let header = jsonwebtoken::decode_header(token).map_err(|e| Refusal::Malformed(e.to_string()))?;
        if header.alg != Algorithm::EdDSA {
            return Err(Refusal::Malformed("not an EdDSA token".into()));
        }
        let trust = self.trust.read();
        let decode = |key: &DecodingKey| {
            jsonwebtoken::decode::<Claims>(token, key, &self.validation).map(|d| d.claims).map_err(|e| match e.kind() {
                ErrorKind::InvalidSignature => Refusal::BadSignature,
                ErrorKind::ExpiredSignature => Refusal::Expired,
                ErrorKind::InvalidAlgorithm => Refusal::Malformed("not an EdDSA token".into()),
                _ => Refusal::Malformed(e.to_string()),
            })
        };
        let claims = match &header.kid {
            Some(kid) => match trust.keys.iter().find(|k| &k.kid == kid) {
                Some(key) => decode(&key.key)?,
                None => {
                    let key = trust.issuers.iter().find(|k| &k.kid == kid).ok_or(Refusal::UnknownKey)?;
                    let claims = decode(&key.key)?;
                    check_issued(&claims)?;
                    claims
                }
            },
            // Tokens from before key ids: whichever of the cluster's keys
            // signed it (an issuer's tokens always name their key).
            None => {
                let mut outcome = Err(Refusal::BadSignature);
                for key in &trust.keys {
                    outcome = decode(&key.key);
                    if !matches!(outcome, Err(Refusal::BadSignature)) {
                        break;
                    }
                }
                outcome?
            }
        };
        if let Some(jti) = &claims.jti {
            if trust.revoked.contains(jti) {
                return Err(Refusal::Revoked);
            }
        }
        match (claims.scope, claims.tenant_id) {
            (Scope::Tenant, None) => Err(Refusal::Malformed("a tenant token without a tenant_id".into())),
            (Scope::Management | Scope::Controller | Scope::Service, Some(_)) => {
                Err(Refusal::Malformed(format!("a {} token with a tenant_id", claims.scope)))
            }
            (Scope::Management | Scope::Controller | Scope::Service, None)
                if claims.timeline_id.is_some() || claims.read_only =>
            {
                Err(Refusal::Malformed(format!("a {} token bound to a timeline or read-only", claims.scope)))
            }
            _ => Ok(claims),
        }
    }
}

/// What an issuer's key may sign: a renewed tenant token that expires
/// within [`MAX_ISSUED_TTL`] of its issue. So a controller's host, which
/// holds an issuer key, can never mint a management, controller or service
/// token, nor one that never expires.
fn check_issued(claims: &Claims) -> Result<(), Refusal> {
    let lifetime = claims.exp.map(|exp| exp.saturating_sub(claims.iat));
    match (claims.scope, lifetime) {
        (Scope::Tenant, Some(secs)) if secs <= MAX_ISSUED_TTL.as_secs() => Ok(()),
        _ => Err(Refusal::Malformed(format!(
            "an issuer's key signs only tenant tokens that expire within {} s",
            MAX_ISSUED_TTL.as_secs()
        ))),
    }
}

/// Mints tokens with the cluster's private key, each naming the key (`kid`).
pub struct Signer {
    key: EncodingKey,
    kid: String,
}

impl Signer {
    /// From a private key in PKCS#8 PEM (`-----BEGIN PRIVATE KEY-----`).
    pub fn from_pem(pem: &[u8], what: &str) -> Result<Signer, KeyError> {
        let key = EncodingKey::from_ed_pem(pem).map_err(|e| KeyError::Format {
            what: what.to_string(),
            kind: "private",
            message: e.to_string(),
        })?;
        Ok(Signer { key, kid: keys::private_key_id(pem, what)? })
    }

    /// The id of the key it signs with.
    pub fn key_id(&self) -> &str {
        &self.kid
    }

    /// From a private key file.
    pub fn load(path: &Path) -> Result<Signer, KeyError> {
        Signer::from_pem(&read(path)?, &path.display().to_string())
    }

    /// A signed token of `claims`.
    pub fn sign(&self, claims: &Claims) -> String {
        debug_assert_eq!(claims.scope == Scope::Tenant, claims.tenant_id.is_some(), "{claims:?}");
        let header = Header { kid: Some(self.kid.clone()), ..Header::new(Algorithm::EdDSA) };
        jsonwebtoken::encode(&header, claims, &self.key).expect("an Ed25519 key loaded from PEM signs any claims")
    }
}

/// A new random password: 32 letters and digits (190 bits), from the
/// system's random source; safe in a URI and a libpq connection string.
pub fn generate_password() -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let random = rustls::crypto::aws_lc_rs::default_provider().secure_random;
    let mut out = String::with_capacity(32);
    let mut buf = [0u8; 64];
    while out.len() < 32 {
        random.fill(&mut buf).expect("the system's random source works");
        // Bytes below 248 (4 × 62) map to the alphabet without bias.
        for b in buf.iter().filter(|&&b| b < 248) {
            if out.len() < 32 {
                out.push(char::from(ALPHABET[usize::from(*b) % ALPHABET.len()]));
            }
        }
    }
    out
}

/// A new Ed25519 key pair: (private key as PKCS#8 PEM, public key as PEM).
pub fn generate_key_pair() -> (String, String) {
    let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).expect("the system's random source works");
    (pair.serialize_pem(), pair.public_key_pem())
}

/// What a service needs to check callers and to call others.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    /// The cluster's public key (PEM): tokens signed by it are accepted.
    pub public_key: PathBuf,
    /// A file holding this process's own token, sent when it calls other
    /// services (private to its owner, else refused; never logged).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_file: Option<PathBuf>,
    /// The audit log's file (JSON lines: refusals and calls that change
    /// something, see [`crate::audit`]); none: no audit log.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit_log: Option<PathBuf>,
}

impl AuthConfig {
    /// The verifier of `public_key`.
    pub fn verifier(&self) -> Result<Verifier, KeyError> {
        Verifier::load(&self.public_key)
    }

    /// This process's own token, if it has one, kept as its file is
    /// (see [`load_token`]).
    pub fn token(&self) -> Result<Option<Token>, KeyError> {
        self.token_file.as_deref().map(load_token).transpose()
    }
}

/// The token of an `Authorization` header's value `Bearer <token>`.
pub fn bearer_token(value: &str) -> Option<&str> {
    let (kind, token) = value.split_once(' ')?;
    kind.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// The token in the file at `path` (one token, surrounding white space
/// ignored; the file private to its owner, see [`read_private`]); the
/// error never shows the file's contents.
pub fn read_token(path: &Path) -> Result<Token, KeyError> {
    let bad = |message: &str| KeyError::Token { path: path.to_path_buf(), message: message.into() };
    let bytes = read_private(path).map_err(|source| KeyError::Io { path: path.to_path_buf(), source })?;
    let text = String::from_utf8(bytes).map_err(|_| bad("not UTF-8"))?;
    let token = text.trim();
    if token.is_empty() || token.len() > MAX_TOKEN_LEN || token.chars().any(char::is_whitespace) {
        return Err(bad("does not hold one token"));
    }
    Ok(Token::new(token.to_string()))
}

/// The token in the file at `path`, which follows the file from then on:
/// when the file changes (a key rotated, a token renewed), every clone of
/// the token takes the new one.
pub fn load_token(path: &Path) -> Result<Token, KeyError> {
    // The file as it was before it was read: a change from then on is seen.
    let seen = stamp(path);
    let token = read_token(path)?;
    watch(path.to_path_buf(), token.clone(), seen);
    Ok(token)
}

/// Watches the token file at `path` from a thread of its own (one per
/// file, for the life of the process), from what it was at `seen`, and
/// puts what it holds into `token` when it changes; a file that turned
/// unreadable is logged and the token kept.
fn watch(path: PathBuf, token: Token, mut seen: Option<FileStamp>) {
    let shown = path.display().to_string();
    let spawned = std::thread::Builder::new().name("token-file".into()).spawn(move || loop {
        std::thread::sleep(AUTH_RELOAD_INTERVAL);
        let now = stamp(&path);
        if now == seen {
            continue;
        }
        seen = now;
        match read_token(&path) {
            Ok(new) if new != token => {
                token.replace(new.expose().to_string());
                tracing::info!(file = %path.display(), "own token read again");
            }
            Ok(_) => {}
            Err(e) => tracing::error!("{e}; the token read before is kept"),
        }
    });
    if let Err(e) = spawned {
        tracing::error!(file = %shown, "no thread to watch the token file ({e}): it is read only once");
    }
}

/// Writes `contents` durably to a file readable by its owner only.
pub fn write_secret(path: &Path, contents: &str) -> Result<(), crate::durable::FileError> {
    crate::durable::replace_file_with_mode(path, contents.as_bytes(), true, 0o600)
}

/// Fuzz entry point: `data` as a token and as an `Authorization` header
/// must be refused or accepted without a panic, as a deny list or key file
/// read or refused whole; and as claims (JSON), signed with a real key,
/// must verify to exactly one outcome.
pub fn fuzz_one(data: &[u8]) {
    use std::sync::OnceLock;
    static KEYS: OnceLock<(Signer, Verifier)> = OnceLock::new();
    let (signer, verifier) = KEYS.get_or_init(|| {
        let (private, public) = generate_key_pair();
        (
            Signer::from_pem(private.as_bytes(), "fuzz").expect("a new key loads"),
            Verifier::from_pem(public.as_bytes(), "fuzz").expect("a new key loads"),
        )
    });
    let text = String::from_utf8_lossy(data);
    if let Ok(claims) = verifier.verify(&text) {
        panic!("an unsigned input verified: {claims:?}");
    }
    // The other files a verifier reads, and a holder's look at its token.
    if let Ok(list) = DenyList::parse(data) {
        assert!(list.len() <= crate::limits::MAX_REVOKED);
        assert_eq!(DenyList::parse(list.to_json().as_bytes()), Ok(list), "a deny list round-trips");
    }
    if let Ok(keys) = keys::parse(data, "fuzz") {
        assert!(!keys.is_empty() && keys.len() <= crate::limits::MAX_TRUSTED_KEYS);
    }
    let _ = unverified_lifetime(&text);
    let _ = bearer_token(&text);
    if let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) {
        let token =
            jsonwebtoken::encode(&Header::new(Algorithm::EdDSA), &value, &signer.key).expect("any JSON value signs");
        if let Ok(claims) = verifier.verify(&token) {
            // What verifies is consistent with its scope.
            assert_eq!(claims.scope == Scope::Tenant, claims.tenant_id.is_some(), "{claims:?}");
            assert!(claims.scope == Scope::Tenant || (claims.timeline_id.is_none() && !claims.read_only), "{claims:?}");
            let _ = claims.permits(Access::Management);
            if let (Some(tenant), Some(timeline)) = (claims.tenant_id, claims.timeline_id) {
                // A read-only token never proposes; a bound one never reads another timeline.
                assert_eq!(claims.permits(Access::Propose(tenant, timeline)).is_ok(), !claims.read_only, "{claims:?}");
                let other = TimelineId(timeline.0.map(|b| !b));
                assert!(claims.permits(Access::Timeline(tenant, other)).is_err(), "{claims:?}");
            }
        }
    }
}

#[cfg(test)]
mod tests;
