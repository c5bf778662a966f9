//! Identifiers: tenants (one PostgreSQL cluster), timelines (a branch of it),
//! nodes (one safekeeper or pageserver).

use std::fmt;
use std::str::FromStr;

macro_rules! id128 {
    ($name:ident, $what:literal) => {
        #[doc = concat!("A ", $what, " id: 16 random bytes, printed as 32 hex digits.")]
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
        pub struct $name(pub [u8; 16]);

        impl $name {
            /// A new random id.
            pub fn generate() -> $name {
                let mut bytes = [0u8; 16];
                getrandom::fill(&mut bytes).expect("the OS random source works");
                $name(bytes)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&hex::encode(self.0))
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(self, f)
            }
        }

        impl FromStr for $name {
            type Err = IdParseError;
            fn from_str(s: &str) -> Result<$name, IdParseError> {
                let mut bytes = [0u8; 16];
                hex::decode_to_slice(s, &mut bytes).map_err(|_| IdParseError { what: $what, input: s.to_string() })?;
                Ok($name(bytes))
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.to_string())
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<$name, D::Error> {
                let s = <String as serde::Deserialize>::deserialize(d)?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

id128!(TenantId, "tenant");
id128!(TimelineId, "timeline");

/// Not a 32-hex-digit id.
#[derive(Debug, Clone, thiserror::Error)]
#[error("invalid {what} id {input:?}: expected 32 hexadecimal digits")]
pub struct IdParseError {
    pub what: &'static str,
    pub input: String,
}

/// A node (safekeeper or pageserver) id, unique within a deployment.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct NodeId(pub u64);

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_roundtrip_and_reject_garbage() {
        let t = TenantId::generate();
        assert_eq!(t.to_string().parse::<TenantId>().unwrap(), t);
        assert_ne!(TenantId::generate(), t);
        assert!("xyz".parse::<TimelineId>().is_err());
        assert!("00112233445566778899aabbccddeeff00".parse::<TimelineId>().is_err());
        assert_eq!("00112233445566778899aabbccddeeff".parse::<TimelineId>().unwrap().0[15], 0xff);
    }
}
