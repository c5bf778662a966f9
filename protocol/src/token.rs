//! Tokens as held and carried (`docs/security.md`).

use std::fmt;

/// A signed token that proves what its holder may do, held in memory or
/// carried in a message. Its debug output hides it, so messages and
/// configurations that hold one can be logged whole: tokens are never logged.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(pub String);

impl Token {
    pub fn new(token: String) -> Token {
        Token(token)
    }

    /// `None` for an empty string: the wire encodes "no token" as "".
    pub fn from_wire(s: String) -> Option<Token> {
        (!s.is_empty()).then_some(Token(s))
    }

    /// The token itself, to send.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The value of an HTTP `Authorization` header carrying it.
    pub fn bearer(&self) -> String {
        format!("Bearer {}", self.0)
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(..)")
    }
}

/// The wire form of an optional token: the empty string for none.
pub fn wire(token: &Option<Token>) -> &str {
    token.as_ref().map_or("", Token::expose)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_shows_in_debug_and_empty_is_none() {
        let t = Token("secret-bits".into());
        assert_eq!(format!("{t:?}"), "Token(..)");
        assert_eq!(format!("{:?}", Some(t.clone())), "Some(Token(..))");
        assert_eq!(Token::from_wire(String::new()), None);
        assert_eq!(Token::from_wire("x".into()), Some(Token("x".into())));
        assert_eq!(wire(&Some(t)), "secret-bits");
        assert_eq!(wire(&None), "");
        assert_eq!(Token::new("a".into()).bearer(), "Bearer a");
    }
}
