//! SCRAM-SHA-256 (RFC 5802, RFC 7677) as PostgreSQL speaks it, at both
//! ends of the proxy (`docs/proxy.md`, "Authentication").
//!
//! The proxy holds a role's *verifier* (what `pg_authid` holds: salt,
//! iterations, StoredKey, ServerKey), never its password. Checking a
//! client's proof against StoredKey yields the client's ClientKey
//! (proof XOR HMAC(StoredKey, AuthMessage)); the compute's role has the
//! same verifier, so that ClientKey is all the proxy needs to prove itself
//! to the compute in a second exchange. Neither exchange reveals the
//! password, and a proxy that is robbed of its verifiers gives no one a
//! login (a ClientKey cannot be made from a verifier).
//!
//! Channel binding (SCRAM-SHA-256-PLUS) is not offered: the client's TLS
//! ends at the proxy, so its binding could not be carried to the compute.

use aws_lc_rs::{digest, hmac, pbkdf2};
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;

use crate::limits::{
    MAX_SCRAM_ITERATIONS as MAX_ITERATIONS, MAX_SCRAM_MESSAGE as MAX_MESSAGE, SCRAM_ITERATIONS as ITERATIONS,
};

/// The SASL mechanism's name.
pub const MECHANISM: &str = "SCRAM-SHA-256";
/// SHA-256's output size: every key of a verifier.
const KEY_LEN: usize = 32;

/// Why an exchange failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScramError {
    /// The peer's message breaks the protocol (the client or the server sent garbage).
    #[error("malformed SCRAM message: {0}")]
    Malformed(String),
    /// The client's proof does not match: a wrong password.
    #[error("password authentication failed")]
    WrongProof,
    /// The compute's role has another verifier than the proxy's.
    #[error("the compute's verifier is not the proxy's ({0})")]
    OtherVerifier(String),
    /// The compute could not prove it knows the verifier.
    #[error("the compute's server signature is wrong")]
    WrongServerSignature,
    /// A verifier that is not `SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>`.
    #[error("not a SCRAM-SHA-256 verifier: {0}")]
    BadVerifier(String),
}

fn malformed(what: impl Into<String>) -> ScramError {
    ScramError::Malformed(what.into())
}

/// A role's SCRAM-SHA-256 verifier, as PostgreSQL stores it.
#[derive(Clone, PartialEq, Eq)]
pub struct Verifier {
    pub iterations: u32,
    pub salt: Vec<u8>,
    stored_key: [u8; KEY_LEN],
    server_key: [u8; KEY_LEN],
}

impl std::fmt::Debug for Verifier {
    // Keys stay out of logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Verifier {{ iterations: {}, .. }}", self.iterations)
    }
}

fn key(bytes: &[u8], what: &str) -> Result<[u8; KEY_LEN], ScramError> {
    let v = B64.decode(bytes).map_err(|e| ScramError::BadVerifier(format!("{what}: {e}")))?;
    v.try_into().map_err(|_| ScramError::BadVerifier(format!("{what} is not {KEY_LEN} bytes")))
}

fn hmac_sha256(key: &[u8], parts: &[&[u8]]) -> [u8; KEY_LEN] {
    let k = hmac::Key::new(hmac::HMAC_SHA256, key);
    let mut ctx = hmac::Context::with_key(&k);
    for p in parts {
        ctx.update(p);
    }
    ctx.sign().as_ref().try_into().expect("HMAC-SHA-256 is 32 bytes")
}

fn sha256(data: &[u8]) -> [u8; KEY_LEN] {
    digest::digest(&digest::SHA256, data).as_ref().try_into().expect("SHA-256 is 32 bytes")
}

fn xor(a: &[u8; KEY_LEN], b: &[u8; KEY_LEN]) -> [u8; KEY_LEN] {
    std::array::from_fn(|i| a[i] ^ b[i])
}

/// Equal in time independent of where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Verifier {
    /// Parses `SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>`.
    pub fn parse(text: &str) -> Result<Verifier, ScramError> {
        let bad = |why: &str| ScramError::BadVerifier(why.to_string());
        let rest = text.strip_prefix("SCRAM-SHA-256$").ok_or_else(|| bad("no SCRAM-SHA-256$ prefix"))?;
        let (params, keys) = rest.split_once('$').ok_or_else(|| bad("no keys"))?;
        let (iterations, salt) = params.split_once(':').ok_or_else(|| bad("no salt"))?;
        let (stored, server) = keys.split_once(':').ok_or_else(|| bad("no ServerKey"))?;
        let iterations: u32 = iterations.parse().map_err(|_| bad("iterations is not a number"))?;
        if !(1..=MAX_ITERATIONS).contains(&iterations) {
            return Err(bad("iterations out of range"));
        }
        let salt = B64.decode(salt).map_err(|e| ScramError::BadVerifier(format!("salt: {e}")))?;
        if salt.is_empty() {
            return Err(bad("empty salt"));
        }
        let (stored_key, server_key) = (key(stored.as_bytes(), "StoredKey")?, key(server.as_bytes(), "ServerKey")?);
        Ok(Verifier { iterations, salt, stored_key, server_key })
    }

    /// The verifier of `password` with this salt (no SASLprep: Strata's
    /// passwords are ASCII letters and digits, which it leaves unchanged).
    pub fn from_password(password: &str, salt: &[u8], iterations: u32) -> Verifier {
        let mut salted = [0u8; KEY_LEN];
        let rounds = std::num::NonZeroU32::new(iterations.max(1)).expect("at least one");
        pbkdf2::derive(pbkdf2::PBKDF2_HMAC_SHA256, rounds, salt, password.as_bytes(), &mut salted);
        let client_key = hmac_sha256(&salted, &[b"Client Key"]);
        Verifier {
            iterations,
            salt: salt.to_vec(),
            stored_key: sha256(&client_key),
            server_key: hmac_sha256(&salted, &[b"Server Key"]),
        }
    }

    /// The verifier of `password` with a new random salt (16 bytes, as
    /// PostgreSQL makes them) and [`ITERATIONS`].
    pub fn generate(password: &str) -> Verifier {
        let mut salt = [0u8; 16];
        aws_lc_rs::rand::fill(&mut salt).expect("the system's random source works");
        Verifier::from_password(password, &salt, ITERATIONS)
    }

    /// Whether `password` is the password behind this verifier.
    pub fn is_of(&self, password: &str) -> bool {
        let other = Verifier::from_password(password, &self.salt, self.iterations);
        same(&other.stored_key, &self.stored_key)
    }

    /// A verifier no password matches, the same for the same `seed`: an
    /// exchange for an endpoint that does not exist looks like any other
    /// and fails like a wrong password, so a client learns nothing of
    /// which endpoints exist before it authenticates.
    pub fn decoy(seed: &[u8]) -> Verifier {
        let salt = hmac_sha256(seed, &[b"decoy salt"])[..16].to_vec();
        Verifier {
            iterations: ITERATIONS,
            salt,
            stored_key: hmac_sha256(seed, &[b"decoy stored key"]),
            server_key: hmac_sha256(seed, &[b"decoy server key"]),
        }
    }

    /// As PostgreSQL stores it (`ALTER ROLE … PASSWORD '<this>'` sets it as is).
    pub fn to_text(&self) -> String {
        format!(
            "SCRAM-SHA-256${}:{}${}:{}",
            self.iterations,
            B64.encode(&self.salt),
            B64.encode(self.stored_key),
            B64.encode(self.server_key)
        )
    }
}

/// What a client proved it has: the key the compute's exchange needs.
#[derive(Clone)]
pub struct ClientKey([u8; KEY_LEN]);

/// `name=value` attributes of a SCRAM message, in order.
fn attributes(msg: &str) -> Result<Vec<(char, &str)>, ScramError> {
    msg.split(',')
        .map(|part| {
            let mut chars = part.chars();
            match (chars.next(), chars.next()) {
                (Some(name), Some('=')) if name.is_ascii_alphabetic() => Ok((name, &part[2..])),
                _ => Err(malformed(format!("attribute {part:?}"))),
            }
        })
        .collect()
}

fn text(msg: &[u8]) -> Result<&str, ScramError> {
    if msg.len() > MAX_MESSAGE {
        return Err(malformed(format!("{} bytes", msg.len())));
    }
    std::str::from_utf8(msg).map_err(|_| malformed("not UTF-8"))
}

/// A nonce: printable ASCII but `,` (RFC 5802's `printable`).
fn check_nonce(nonce: &str) -> Result<(), ScramError> {
    let ok = !nonce.is_empty() && nonce.bytes().all(|b| (0x21..=0x7e).contains(&b) && b != b',');
    if ok {
        Ok(())
    } else {
        Err(malformed("a nonce of other than printable characters"))
    }
}

/// A random nonce of printable characters (no `,`): 18 random bytes in base64.
pub fn nonce() -> String {
    let mut bytes = [0u8; 18];
    aws_lc_rs::rand::fill(&mut bytes).expect("the system's random source works");
    B64.encode(bytes)
}

/// The server's side: checks a client's proof against a verifier.
pub struct ServerExchange {
    verifier: Verifier,
    gs2_header: String,
    client_first_bare: String,
    server_first: String,
    nonce: String,
}

impl ServerExchange {
    /// Takes the client-first message; answers the server-first message.
    /// `server_nonce` must be random (printable, no `,`).
    pub fn start(verifier: &Verifier, client_first: &[u8], server_nonce: &str) -> Result<(Self, String), ScramError> {
        let msg = text(client_first)?;
        // gs2-header: `n,,` (no channel binding) or `y,,` (the client could
        // bind but thinks we cannot); `p=` asks for a binding never offered.
        let bare = match msg.get(..3) {
            Some("n,,") | Some("y,,") => &msg[3..],
            _ if msg.starts_with("p=") => return Err(malformed("channel binding was not offered")),
            _ => return Err(malformed("gs2 header")),
        };
        let attrs = attributes(bare)?;
        // PostgreSQL takes the user from the startup packet; `n=` is ignored.
        let nonce = match attrs.as_slice() {
            [('n', _), ('r', nonce), ..] => *nonce,
            _ => return Err(malformed("client-first: n= and r= first")),
        };
        if attrs.iter().any(|(n, _)| *n == 'm') {
            return Err(malformed("a mandatory extension"));
        }
        check_nonce(nonce)?;
        check_nonce(server_nonce)?;
        let nonce = format!("{nonce}{server_nonce}");
        let server_first = format!("r={nonce},s={},i={}", B64.encode(&verifier.salt), verifier.iterations);
        let me = ServerExchange {
            verifier: verifier.clone(),
            gs2_header: msg[..3].to_string(),
            client_first_bare: bare.to_string(),
            server_first: server_first.clone(),
            nonce,
        };
        Ok((me, server_first))
    }

    /// Takes the client-final message; with a right proof, the client's key
    /// and the server-final message.
    pub fn finish(self, client_final: &[u8]) -> Result<(ClientKey, String), ScramError> {
        let msg = text(client_final)?;
        let (without_proof, proof) = msg.rsplit_once(",p=").ok_or_else(|| malformed("client-final: no proof"))?;
        let attrs = attributes(without_proof)?;
        let (binding, nonce) = match attrs.as_slice() {
            [('c', c), ('r', r), ..] => (*c, *r),
            _ => return Err(malformed("client-final: c= and r= first")),
        };
        if B64.decode(binding).ok().as_deref() != Some(self.gs2_header.as_bytes()) {
            return Err(malformed("client-final: channel binding differs from the gs2 header"));
        }
        if !same(nonce.as_bytes(), self.nonce.as_bytes()) {
            return Err(malformed("client-final: another nonce"));
        }
        let proof: [u8; KEY_LEN] = B64
            .decode(proof)
            .ok()
            .and_then(|p| p.try_into().ok())
            .ok_or_else(|| malformed("client-final: a proof of other than 32 bytes"))?;
        let auth =
            [self.client_first_bare.as_bytes(), b",", self.server_first.as_bytes(), b",", without_proof.as_bytes()];
        let client_signature = hmac_sha256(&self.verifier.stored_key, &auth);
        let client_key = xor(&proof, &client_signature);
        if !same(&sha256(&client_key), &self.verifier.stored_key) {
            return Err(ScramError::WrongProof);
        }
        let server_signature = hmac_sha256(&self.verifier.server_key, &auth);
        Ok((ClientKey(client_key), format!("v={}", B64.encode(server_signature))))
    }
}

/// The client's side, with a ClientKey instead of a password: how the
/// proxy logs in to the compute.
pub struct ClientExchange {
    nonce: String,
    client_first_bare: String,
    /// Set by [`ClientExchange::server_first`]: the AuthMessage so far.
    auth: Option<String>,
}

impl ClientExchange {
    /// The client-first message (`n,,n=,r=<nonce>`); `nonce` must be random.
    pub fn start(nonce: &str) -> (ClientExchange, String) {
        debug_assert!(check_nonce(nonce).is_ok(), "a nonce of printable characters");
        let bare = format!("n=,r={nonce}");
        let first = format!("n,,{bare}");
        (ClientExchange { nonce: nonce.to_string(), client_first_bare: bare, auth: None }, first)
    }

    /// Takes the server-first message; answers the client-final one. The
    /// compute's salt and iterations must be the verifier's.
    pub fn server_first(&mut self, msg: &[u8], key: &ClientKey, verifier: &Verifier) -> Result<String, ScramError> {
        let msg = text(msg)?;
        let attrs = attributes(msg)?;
        let (nonce, salt, iterations) = match attrs.as_slice() {
            [('r', r), ('s', s), ('i', i), ..] => (*r, *s, *i),
            _ => return Err(malformed("server-first: r=, s= and i=")),
        };
        if !nonce.starts_with(&self.nonce) || nonce.len() == self.nonce.len() {
            return Err(malformed("server-first: a nonce that does not extend ours"));
        }
        check_nonce(nonce)?;
        let salt = B64.decode(salt).map_err(|_| malformed("server-first: salt"))?;
        let iterations: u32 = iterations.parse().map_err(|_| malformed("server-first: iterations"))?;
        if salt != verifier.salt || iterations != verifier.iterations {
            return Err(ScramError::OtherVerifier("another salt or iteration count".into()));
        }
        let without_proof = format!("c=biws,r={nonce}");
        let auth = format!("{},{msg},{without_proof}", self.client_first_bare);
        let signature = hmac_sha256(&verifier.stored_key, &[auth.as_bytes()]);
        let proof = xor(&key.0, &signature);
        self.auth = Some(auth);
        Ok(format!("{without_proof},p={}", B64.encode(proof)))
    }

    /// Checks the server-final message: the compute knows the ServerKey.
    pub fn server_final(&self, msg: &[u8], verifier: &Verifier) -> Result<(), ScramError> {
        let msg = text(msg)?;
        let auth = self.auth.as_ref().ok_or_else(|| malformed("server-final before server-first"))?;
        let attrs = attributes(msg)?;
        let signature = match attrs.as_slice() {
            [('v', v), ..] => B64.decode(v).map_err(|_| malformed("server-final: signature"))?,
            [('e', e), ..] => return Err(malformed(format!("the server refused: {e}"))),
            _ => return Err(malformed("server-final: v=")),
        };
        let expected = hmac_sha256(&verifier.server_key, &[auth.as_bytes()]);
        if same(&signature, &expected) {
            Ok(())
        } else {
            Err(ScramError::WrongServerSignature)
        }
    }
}

/// Fuzzing entry: every message decoder of both sides on arbitrary
/// bytes, which must return an error and never panic.
#[doc(hidden)]
pub fn fuzz_messages(data: &[u8]) {
    let verifier = Verifier::from_password("x", b"0123456789abcdef", 1);
    let _ = Verifier::parse(&String::from_utf8_lossy(data));
    let (half, rest) = data.split_at(data.len() / 2);
    if let Ok((server, _)) = ServerExchange::start(&verifier, half, "servernonce") {
        let _ = server.finish(rest);
    }
    let (mut client, _) = ClientExchange::start("clientnonce");
    let key = ClientKey([7; KEY_LEN]);
    let _ = client.server_first(half, &key, &verifier);
    let _ = client.server_final(rest, &verifier);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 7677's example exchange (user `user`, password `pencil`).
    const CLIENT_FIRST: &str = "n,,n=user,r=rOprNGfwEbeRWgbNEkqO";
    const SERVER_FIRST: &str = "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
    const CLIENT_FINAL: &str =
        "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=";
    const SERVER_FINAL: &str = "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=";

    fn rfc_verifier() -> Verifier {
        Verifier::from_password("pencil", &B64.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap(), 4096)
    }

    #[test]
    fn the_server_side_matches_rfc_7677() {
        let v = rfc_verifier();
        let (server, first) =
            ServerExchange::start(&v, CLIENT_FIRST.as_bytes(), "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0").unwrap();
        assert_eq!(first, SERVER_FIRST);
        let (_, last) = server.finish(CLIENT_FINAL.as_bytes()).unwrap();
        assert_eq!(last, SERVER_FINAL);
        // One bit of the proof off: a wrong password.
        let (server, _) = ServerExchange::start(&v, CLIENT_FIRST.as_bytes(), "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0").unwrap();
        let wrong = CLIENT_FINAL.replace("p=dHzb", "p=dHzc");
        assert_eq!(server.finish(wrong.as_bytes()).err(), Some(ScramError::WrongProof));
    }

    #[test]
    fn a_verifier_round_trips_through_its_text() {
        let v = rfc_verifier();
        let text = v.to_text();
        assert!(text.starts_with("SCRAM-SHA-256$4096:W22ZaJ0SNY7soEsUEjb6gQ==$"), "{text}");
        assert_eq!(Verifier::parse(&text).unwrap(), v);
        for bad in [
            "",
            "md5abc",
            "SCRAM-SHA-256$4096:c2FsdA==",
            "SCRAM-SHA-256$x:c2FsdA==$a:b",
            "SCRAM-SHA-256$0:c2FsdA==$a:b",
            "SCRAM-SHA-256$4096:$a:b",
            "SCRAM-SHA-256$4096:c2FsdA==$c2hvcnQ=:c2hvcnQ=",
        ] {
            assert!(Verifier::parse(bad).is_err(), "{bad}");
        }
    }

    /// The proxy's whole path: a client with the password against the
    /// proxy's verifier, then the proxy with the client's key against a
    /// server holding the same verifier.
    #[test]
    fn a_client_key_logs_in_where_the_verifier_is_the_same() {
        let v = Verifier::from_password("secret", b"saltsaltsaltsalt", 4096);
        // The client: a password-holding SCRAM client (the RFC's steps).
        let client_nonce = "abcdefghijkl";
        let first = format!("n,,n=,r={client_nonce}");
        let (server, server_first) = ServerExchange::start(&v, first.as_bytes(), "MNOPQRSTUVWX").unwrap();
        let mut salted = [0u8; 32];
        pbkdf2::derive(
            pbkdf2::PBKDF2_HMAC_SHA256,
            4096.try_into().unwrap(),
            b"saltsaltsaltsalt",
            b"secret",
            &mut salted,
        );
        let client_key = hmac_sha256(&salted, &[b"Client Key"]);
        let nonce = format!("{client_nonce}MNOPQRSTUVWX");
        let without = format!("c=biws,r={nonce}");
        let auth = format!("n=,r={client_nonce},{server_first},{without}");
        let proof = xor(&client_key, &hmac_sha256(&sha256(&client_key), &[auth.as_bytes()]));
        let (key, _) = server.finish(format!("{without},p={}", B64.encode(proof)).as_bytes()).unwrap();
        assert_eq!(key.0, client_key);

        // The proxy against the compute.
        let (mut proxy, proxy_first) = ClientExchange::start("proxynonce");
        let (compute, compute_first) = ServerExchange::start(&v, proxy_first.as_bytes(), "computenonce").unwrap();
        let proxy_final = proxy.server_first(compute_first.as_bytes(), &key, &v).unwrap();
        let (_, compute_final) = compute.finish(proxy_final.as_bytes()).unwrap();
        proxy.server_final(compute_final.as_bytes(), &v).unwrap();
        // A compute whose role has another verifier is told apart.
        let other = Verifier::from_password("secret", b"othersaltothersa", 4096);
        let (mut proxy, first) = ClientExchange::start("proxynonce");
        let (_, compute_first) = ServerExchange::start(&other, first.as_bytes(), "n2").unwrap();
        assert!(matches!(proxy.server_first(compute_first.as_bytes(), &key, &v), Err(ScramError::OtherVerifier(_))));
    }

    #[test]
    fn generated_verifiers_have_their_own_salt_and_know_their_password() {
        let (a, b) = (Verifier::generate("pw"), Verifier::generate("pw"));
        assert_ne!(a.salt, b.salt);
        assert!(a.is_of("pw") && b.is_of("pw") && !a.is_of("other"));
        assert_eq!(a.salt.len(), 16);
        assert_eq!(a.iterations, ITERATIONS);
    }

    #[test]
    fn a_decoy_is_stable_and_matches_nothing() {
        assert_eq!(Verifier::decoy(b"ep1"), Verifier::decoy(b"ep1"));
        assert_ne!(Verifier::decoy(b"ep1"), Verifier::decoy(b"ep2"));
        let v = Verifier::decoy(b"ep1");
        let (server, _) = ServerExchange::start(&v, b"n,,n=,r=abc", "def").unwrap();
        let proof = B64.encode([0u8; 32]);
        assert_eq!(server.finish(format!("c=biws,r=abcdef,p={proof}").as_bytes()).err(), Some(ScramError::WrongProof));
    }

    #[test]
    fn malformed_messages_are_errors() {
        let v = rfc_verifier();
        for first in ["", "x", "p=tls-server-end-point,,n=,r=a", "n,,r=a", "n,,n=,r=a,b", "n,,n=,r=", "n,,n=,r=a,m=x"] {
            assert!(ServerExchange::start(&v, first.as_bytes(), "b").is_err(), "{first}");
        }
        assert!(ServerExchange::start(&v, &vec![b'a'; MAX_MESSAGE + 1], "b").is_err());
        let (server, _) = ServerExchange::start(&v, b"n,,n=,r=a", "b").unwrap();
        assert!(matches!(server.finish(b"c=biws,r=ab"), Err(ScramError::Malformed(_))));
        let (server, _) = ServerExchange::start(&v, b"n,,n=,r=a", "b").unwrap();
        assert!(matches!(server.finish(b"c=eSws,r=ab,p=AAAA"), Err(ScramError::Malformed(_))));
        let (mut client, _) = ClientExchange::start("abc");
        let key = ClientKey([0; 32]);
        assert!(client.server_first(b"r=xyz,s=c2FsdA==,i=4096", &key, &v).is_err(), "a nonce not extending ours");
        assert!(client.server_first(b"r=abc,s=c2FsdA==,i=4096", &key, &v).is_err(), "no server part in the nonce");
        assert!(client.server_final(b"v=AAAA", &v).is_err(), "final before first");
        for data in [&b""[..], b"\xff\xfe", b"n,,n=,r=a\x00", b"SCRAM-SHA-256$$$"] {
            fuzz_messages(data);
        }
    }
}
