//! Opening a download as its bytes arrive: the header first (which names
//! the data key), then chunk by chunk, each handed on only once it is
//! authenticated. Memory is one chunk, whatever the object's size.

use strata_protocol::TenantId;

use super::format::{Header, ObjectOpener, HEADER_LEN};
use super::SealError;
use crate::{RemoteError, RemoteStorage};

/// What a download does with the bytes it receives.
pub(crate) enum Incoming {
    /// Passed on as they are (an object that is not sealed).
    Plain,
    /// A tenant's object: opened.
    Sealed { tenant: TenantId, header: Vec<u8>, opener: Option<ObjectOpener> },
}

impl RemoteStorage {
    /// How the download of `key` treats its bytes.
    pub(crate) fn incoming(&self, key: &str) -> Result<Incoming, RemoteError> {
        Ok(match self.sealing_for("downloading", key)? {
            None => Incoming::Plain,
            Some((_, tenant)) => Incoming::Sealed { tenant, header: Vec::with_capacity(HEADER_LEN), opener: None },
        })
    }
}

impl Incoming {
    /// Takes the next bytes of object `key`; appends what is ready (and
    /// authenticated) to `out`.
    pub(crate) async fn push(
        &mut self,
        storage: &RemoteStorage,
        key: &str,
        mut data: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), RemoteError> {
        let refused = |e: SealError| RemoteError::Refused { key: key.to_string(), message: e.to_string() };
        let Incoming::Sealed { tenant, header, opener } = self else {
            out.extend_from_slice(data);
            return Ok(());
        };
        if opener.is_none() {
            let take = (HEADER_LEN - header.len()).min(data.len());
            header.extend_from_slice(&data[..take]);
            data = &data[take..];
            if header.len() < HEADER_LEN {
                // A stranger's bytes are refused as soon as they differ.
                return match Header::decode(header) {
                    Err(SealError::NotSealed) => Err(refused(SealError::NotSealed)),
                    _ => Ok(()),
                };
            }
            let parsed = Header::decode(header).map_err(refused)?;
            let sealing = storage.sealing_for("downloading", key)?.expect("a sealed download has sealing").0;
            let keys = storage
                .tenant_keys(sealing, *tenant, Some(parsed.key_id))
                .await
                .map_err(|e| super::refusal::about(key, e))?;
            let data_key = keys
                .get(parsed.key_id)
                .ok_or_else(|| refused(SealError::Key(format!("no data key {} for tenant {tenant}", parsed.key_id))))?;
            *opener = Some(ObjectOpener::new(data_key, &parsed, key));
        }
        opener.as_mut().expect("set above").push(data, out).map_err(refused)
    }

    /// The end of object `key`: its final chunk is checked.
    pub(crate) fn finish(self, key: &str, out: &mut Vec<u8>) -> Result<(), RemoteError> {
        let refused = |e: SealError| RemoteError::Refused { key: key.to_string(), message: e.to_string() };
        match self {
            Incoming::Plain => Ok(()),
            Incoming::Sealed { header, opener: None, .. } => {
                Err(refused(if header.is_empty() { SealError::NotSealed } else { SealError::Truncated }))
            }
            Incoming::Sealed { opener: Some(o), .. } => o.finish(out).map_err(refused),
        }
    }
}
