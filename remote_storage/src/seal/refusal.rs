//! Refusals of sealed objects and key objects as remote errors, naming the
//! object read (and the key object, when that is what failed).

use crate::RemoteError;

/// The object `key` refused for `message`.
pub(crate) fn refused(key: &str, message: impl std::fmt::Display) -> RemoteError {
    RemoteError::Refused { key: key.to_string(), message: message.to_string() }
}

/// A key object's refusal, as the refusal of the object `object` it was
/// read for (both named).
pub(crate) fn about(object: &str, e: RemoteError) -> RemoteError {
    match e {
        RemoteError::Refused { key, message } if key != object => {
            RemoteError::Refused { key: object.to_string(), message: format!("{key}: {message}") }
        }
        other => other,
    }
}
