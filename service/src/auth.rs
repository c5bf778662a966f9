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

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};
use strata_protocol::{TenantId, TimelineId};

use crate::limits::{LEEWAY_SECS, MAX_TOKEN_LEN};

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
}

impl Claims {
    /// Claims of `scope` issued now, valid for `ttl` (forever if none).
    pub fn new(scope: Scope, tenant_id: Option<TenantId>, ttl: Option<std::time::Duration>) -> Claims {
        let iat = now();
        let exp = ttl.map(|t| iat.saturating_add(t.as_secs().max(1)));
        Claims { scope, tenant_id, timeline_id: None, read_only: false, iat, exp }
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

fn now() -> u64 {
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

/// Why a call was refused. The first four mean "who are you?" (HTTP 401),
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
            Refusal::Scope { .. } => "scope",
            Refusal::OtherTenant => "other_tenant",
            Refusal::OtherTimeline => "other_timeline",
            Refusal::ReadOnly => "read_only",
        }
    }
}

pub use strata_protocol::Token;

/// A key file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{what}: not an Ed25519 {kind} key in PEM: {message}")]
    Format { what: String, kind: &'static str, message: String },
    #[error("{}: {message}", path.display())]
    Token { path: PathBuf, message: String },
}

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

/// Checks tokens against the cluster's public key.
pub struct Verifier {
    key: DecodingKey,
    validation: Validation,
}

impl Verifier {
    /// From a public key in PEM (`-----BEGIN PUBLIC KEY-----`).
    pub fn from_pem(pem: &[u8], what: &str) -> Result<Verifier, KeyError> {
        let key = DecodingKey::from_ed_pem(pem).map_err(|e| KeyError::Format {
            what: what.to_string(),
            kind: "public",
            message: e.to_string(),
        })?;
        let mut validation = Validation::new(Algorithm::EdDSA);
        // `exp` is checked when present; services' own tokens have none.
        validation.required_spec_claims.clear();
        validation.validate_exp = true;
        validation.leeway = LEEWAY_SECS;
        Ok(Verifier { key, validation })
    }

    /// From a public key file.
    pub fn load(path: &Path) -> Result<Verifier, KeyError> {
        Verifier::from_pem(&read(path)?, &path.display().to_string())
    }

    /// Whether `token` is valid and allows `need`; the refusal if not.
    pub fn check(&self, token: &str, need: Access) -> Result<(), Refusal> {
        self.verify(token).and_then(|claims| claims.permits(need))
    }

    /// The claims of `token` if this cluster signed it and it has not expired.
    pub fn verify(&self, token: &str) -> Result<Claims, Refusal> {
        if token.is_empty() {
            return Err(Refusal::NoToken);
        }
        if token.len() > MAX_TOKEN_LEN {
            return Err(Refusal::Malformed(format!("longer than {MAX_TOKEN_LEN} bytes")));
        }
        let claims = jsonwebtoken::decode::<Claims>(token, &self.key, &self.validation)
            .map_err(|e| match e.kind() {
                ErrorKind::InvalidSignature => Refusal::BadSignature,
                ErrorKind::ExpiredSignature => Refusal::Expired,
                ErrorKind::InvalidAlgorithm => Refusal::Malformed("not an EdDSA token".into()),
                _ => Refusal::Malformed(e.to_string()),
            })?
            .claims;
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

/// Mints tokens with the cluster's private key.
pub struct Signer {
    key: EncodingKey,
}

impl Signer {
    /// From a private key in PKCS#8 PEM (`-----BEGIN PRIVATE KEY-----`).
    pub fn from_pem(pem: &[u8], what: &str) -> Result<Signer, KeyError> {
        let key = EncodingKey::from_ed_pem(pem).map_err(|e| KeyError::Format {
            what: what.to_string(),
            kind: "private",
            message: e.to_string(),
        })?;
        Ok(Signer { key })
    }

    /// From a private key file.
    pub fn load(path: &Path) -> Result<Signer, KeyError> {
        Signer::from_pem(&read(path)?, &path.display().to_string())
    }

    /// A signed token of `claims`.
    pub fn sign(&self, claims: &Claims) -> String {
        debug_assert_eq!(claims.scope == Scope::Tenant, claims.tenant_id.is_some(), "{claims:?}");
        jsonwebtoken::encode(&Header::new(Algorithm::EdDSA), claims, &self.key)
            .expect("an Ed25519 key loaded from PEM signs any claims")
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
}

impl AuthConfig {
    /// The verifier of `public_key`.
    pub fn verifier(&self) -> Result<Verifier, KeyError> {
        Verifier::load(&self.public_key)
    }

    /// This process's own token, if it has one.
    pub fn token(&self) -> Result<Option<Token>, KeyError> {
        self.token_file.as_deref().map(read_token).transpose()
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
    Ok(Token(token.to_string()))
}

/// Writes `contents` durably to a file readable by its owner only.
pub fn write_secret(path: &Path, contents: &str) -> Result<(), crate::durable::FileError> {
    crate::durable::replace_file_with_mode(path, contents.as_bytes(), true, 0o600)
}

/// Fuzz entry point: `data` as a token and as an `Authorization` header
/// must be refused or accepted without a panic; and as claims (JSON),
/// signed with a real key, must verify to exactly one outcome.
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
