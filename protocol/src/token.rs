//! Tokens as held and carried (`docs/security.md`).

use std::fmt;
use std::sync::{Arc, RwLock};

/// A signed token that proves what its holder may do, held in memory or
/// carried in a message. Its debug output hides it, so messages and
/// configurations that hold one can be logged whole: tokens are never logged.
///
/// Clones share one value, which [`Token::replace`] changes for all of
/// them: a process's own token, handed to each of its clients at start,
/// is renewed or re-signed after a key rotation in one place.
#[derive(Clone)]
pub struct Token(Arc<RwLock<Arc<str>>>);

impl Token {
    pub fn new(token: String) -> Token {
        Token(Arc::new(RwLock::new(token.into())))
    }

    /// `None` for an empty string: the wire encodes "no token" as "".
    pub fn from_wire(s: String) -> Option<Token> {
        (!s.is_empty()).then(|| Token::new(s))
    }

    /// The token itself as it is now, to send.
    pub fn expose(&self) -> Arc<str> {
        self.0.read().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    /// The value of an HTTP `Authorization` header carrying it.
    pub fn bearer(&self) -> String {
        format!("Bearer {}", self.expose())
    }

    /// Makes `token` the value of this token and of every clone of it.
    pub fn replace(&self, token: String) {
        *self.0.write().unwrap_or_else(|poisoned| poisoned.into_inner()) = token.into();
    }
}

impl PartialEq for Token {
    fn eq(&self, other: &Token) -> bool {
        self.expose() == other.expose()
    }
}

impl Eq for Token {}

/// As a JSON string (in an answer that hands one out).
impl serde::Serialize for Token {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.expose())
    }
}

impl<'de> serde::Deserialize<'de> for Token {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Token, D::Error> {
        let text = String::deserialize(d)?;
        Token::from_wire(text).ok_or_else(|| serde::de::Error::custom("an empty token"))
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(..)")
    }
}

/// The wire form of an optional token: the empty string for none.
pub fn wire(token: &Option<Token>) -> Arc<str> {
    token.as_ref().map_or_else(|| Arc::from(""), Token::expose)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_shows_in_debug_and_empty_is_none() {
        let t = Token::new("secret-bits".into());
        assert_eq!(format!("{t:?}"), "Token(..)");
        assert_eq!(format!("{:?}", Some(t.clone())), "Some(Token(..))");
        assert_eq!(Token::from_wire(String::new()), None);
        assert_eq!(Token::from_wire("x".into()), Some(Token::new("x".into())));
        assert_eq!(&*wire(&Some(t.clone())), "secret-bits");
        assert_eq!(&*wire(&None), "");
        // A replaced value is every clone's.
        let shared = t.clone();
        t.replace("renewed".into());
        assert_eq!(&*shared.expose(), "renewed");
        assert_eq!(shared.bearer(), "Bearer renewed");
        assert_eq!(Token::new("a".into()).bearer(), "Bearer a");
    }
}
