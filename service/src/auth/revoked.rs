//! The deny list: token ids (`jti`) refused before their expiry.
//!
//! `revoked.json` beside the key file, written by `strata auth revoke` and
//! handed to every host with the cluster's state; every verifier reads it
//! again when it changes. An entry is kept until the token it names would
//! have expired anyway (`until`, its `exp`); a token without expiry stays
//! listed until its key is retired, and the list is bounded
//! ([`MAX_REVOKED`]): past that, rotating the key revokes everything at once.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::limits::{LEEWAY_SECS, MAX_JTI_LEN, MAX_REVOKED};

/// The format version of `revoked.json`.
pub const FORMAT_VERSION: u32 = 1;

/// One revoked token.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    pub jti: String,
    /// The token's own expiry (seconds since the epoch); none: it has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<u64>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    version: u32,
    revoked: Vec<Entry>,
}

/// The revoked token ids, each with the time after which its entry is moot.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DenyList(BTreeMap<String, Option<u64>>);

impl DenyList {
    /// Reads a deny list; a file over the bound, of another version, or with
    /// an id that no token could carry is refused whole.
    pub fn parse(bytes: &[u8]) -> Result<DenyList, String> {
        let file: File = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        if file.version != FORMAT_VERSION {
            return Err(format!("format version {} (this build reads {FORMAT_VERSION})", file.version));
        }
        if file.revoked.len() > MAX_REVOKED {
            return Err(format!("{} entries; at most {MAX_REVOKED}", file.revoked.len()));
        }
        let mut list = DenyList::default();
        for entry in file.revoked {
            check_jti(&entry.jti)?;
            list.0.insert(entry.jti, entry.until);
        }
        Ok(list)
    }

    /// The file's bytes.
    pub fn to_json(&self) -> String {
        let revoked = self.0.iter().map(|(jti, until)| Entry { jti: jti.clone(), until: *until }).collect();
        serde_json::to_string_pretty(&File { version: FORMAT_VERSION, revoked }).expect("a deny list serializes") + "\n"
    }

    /// Whether the token `jti` is revoked.
    pub fn contains(&self, jti: &str) -> bool {
        self.0.contains_key(jti)
    }

    /// How many tokens it lists.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Adds `jti` (whose token expires at `until`), dropping the entries of
    /// tokens expired by `now`; refused past the bound.
    pub fn revoke(&mut self, jti: &str, until: Option<u64>, now: u64) -> Result<(), String> {
        check_jti(jti)?;
        self.prune(now);
        if !self.0.contains_key(jti) && self.0.len() >= MAX_REVOKED {
            return Err(format!(
                "the deny list holds {MAX_REVOKED} tokens already: rotate the key (strata auth rotate) to revoke every token it signed"
            ));
        }
        self.0.insert(jti.to_string(), until);
        Ok(())
    }

    /// Drops the entries of tokens that every verifier refuses anyway as
    /// expired (past their `exp` and the verifiers' leeway).
    pub fn prune(&mut self, now: u64) {
        self.0.retain(|_, until| until.is_none_or(|u| u.saturating_add(LEEWAY_SECS) >= now));
    }
}

/// A token id: 1 to [`MAX_JTI_LEN`] letters, digits, `-` or `_`.
pub fn check_jti(jti: &str) -> Result<(), String> {
    let ok = !jti.is_empty()
        && jti.len() <= MAX_JTI_LEN
        && jti.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    match ok {
        true => Ok(()),
        false => Err(format!("{:?} is not a token id", jti.chars().take(MAX_JTI_LEN + 1).collect::<String>())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_expire_and_are_bounded() {
        let mut list = DenyList::default();
        list.revoke("a1", Some(100), 50).unwrap();
        list.revoke("b2", None, 50).unwrap();
        let again = DenyList::parse(list.to_json().as_bytes()).unwrap();
        assert_eq!(again, list);
        assert!(again.contains("a1") && again.contains("b2") && !again.contains("c3"));
        // Past its token's expiry (and the leeway), an entry is dropped; one
        // without expiry stays.
        list.prune(100 + LEEWAY_SECS + 1);
        assert!(!list.contains("a1") && list.contains("b2"));
        for bad in ["", "a b", "x\"", &"z".repeat(MAX_JTI_LEN + 1)] {
            assert!(list.revoke(bad, None, 0).is_err(), "{bad:?}");
        }
        let mut full = DenyList::default();
        for i in 0..MAX_REVOKED {
            full.revoke(&format!("t{i}"), None, 0).unwrap();
        }
        let err = full.revoke("one-more", None, 0).unwrap_err();
        assert!(err.contains("rotate the key"), "{err}");
        // Revoking one already listed is no new entry.
        full.revoke("t0", None, 0).unwrap();
    }

    #[test]
    fn malformed_files_are_refused_whole() {
        for bad in [
            &b"{"[..],
            br#"{"version":2,"revoked":[]}"#,
            br#"{"version":1,"revoked":[{"jti":"a b"}]}"#,
            br#"{"version":1,"revoked":[{"jti":"a","extra":1}]}"#,
            br#"{"version":1}"#,
        ] {
            assert!(DenyList::parse(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
        let too_many: Vec<Entry> = (0..=MAX_REVOKED).map(|i| Entry { jti: format!("t{i}"), until: None }).collect();
        let text = serde_json::to_vec(&File { version: 1, revoked: too_many }).unwrap();
        assert!(DenyList::parse(&text).unwrap_err().contains("at most"));
    }
}
