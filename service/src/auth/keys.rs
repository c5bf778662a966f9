//! The public keys a cluster trusts, each named by its key id (`kid`).
//!
//! The key file holds one or more Ed25519 public keys in PEM, one after
//! another: all of them are trusted. Two at a time is how a key rotates with
//! overlap (`strata auth rotate`): tokens signed by the new key and by the
//! old one both verify until the old one is retired.

use std::path::PathBuf;

use jsonwebtoken::DecodingKey;

use crate::limits::MAX_TRUSTED_KEYS;

/// A key or token file that cannot be used.
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

/// The DER prefix of an Ed25519 `SubjectPublicKeyInfo` (RFC 8410): the
/// algorithm 1.3.101.112 and a 33-byte bit string (no unused bits) whose
/// 32 bytes follow.
const ED25519_SPKI_PREFIX: [u8; 12] = [0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00];

/// The id of a public key: the hex of its first 8 bytes. An Ed25519 public
/// key is already indistinguishable from random, so its prefix names it as
/// well as a hash would; it is public, like the key.
pub fn key_id(raw_public_key: &[u8]) -> String {
    raw_public_key.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// One trusted key.
pub struct TrustedKey {
    /// Its key id.
    pub kid: String,
    /// Its PEM block (LF line endings), as a key file holds it.
    pub pem: String,
    pub(super) key: DecodingKey,
}

/// Every key of a key file, in its order (the newest first, by convention).
pub fn parse(pem_text: &[u8], what: &str) -> Result<Vec<TrustedKey>, KeyError> {
    let bad = |message: String| KeyError::Format { what: what.to_string(), kind: "public", message };
    let blocks = pem::parse_many(pem_text).map_err(|e| bad(e.to_string()))?;
    if blocks.is_empty() {
        return Err(bad("no PEM block".into()));
    }
    if blocks.len() > MAX_TRUSTED_KEYS {
        return Err(bad(format!("{} keys; at most {MAX_TRUSTED_KEYS} are trusted at once", blocks.len())));
    }
    let mut keys: Vec<TrustedKey> = Vec::with_capacity(blocks.len());
    for (i, block) in blocks.iter().enumerate() {
        let der = block.contents();
        if block.tag() != "PUBLIC KEY" || der.len() != 44 || der[..12] != ED25519_SPKI_PREFIX {
            return Err(bad(format!("key {}: not an Ed25519 PUBLIC KEY block", i + 1)));
        }
        let kid = key_id(&der[12..]);
        if keys.iter().any(|k| k.kid == kid) {
            return Err(bad(format!("key {}: the same key twice (kid {kid})", i + 1)));
        }
        let lf = pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF);
        let pem = pem::encode_config(block, lf);
        let key = DecodingKey::from_ed_pem(pem.as_bytes()).map_err(|e| bad(e.to_string()))?;
        keys.push(TrustedKey { kid, pem, key });
    }
    Ok(keys)
}

/// The key id of a private key in PKCS#8 PEM: that of its public half.
pub fn private_key_id(pem_text: &[u8], what: &str) -> Result<String, KeyError> {
    let text = std::str::from_utf8(pem_text).map_err(|_| KeyError::Format {
        what: what.to_string(),
        kind: "private",
        message: "not UTF-8".into(),
    })?;
    let pair = rcgen::KeyPair::from_pem(text).map_err(|e| KeyError::Format {
        what: what.to_string(),
        kind: "private",
        message: e.to_string(),
    })?;
    Ok(key_id(pair.public_key_raw()))
}

/// The public key of a private key in PKCS#8 PEM, as PEM.
pub fn public_of(private_pem: &str) -> Result<String, KeyError> {
    let pair = rcgen::KeyPair::from_pem(private_pem).map_err(|e| KeyError::Format {
        what: "the private key".into(),
        kind: "private",
        message: e.to_string(),
    })?;
    Ok(pair.public_key_pem())
}
