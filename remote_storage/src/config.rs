//! Where a service keeps its objects: the `[remote_storage]` table of a
//! pageserver's (and later a safekeeper's) config.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// A local directory or a bucket of any S3 API.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(tag = "type", rename_all = "lowercase", deny_unknown_fields)]
pub enum RemoteStorageConfig {
    /// A directory, on a local or a network file system.
    Local { path: PathBuf },
    /// A bucket of AWS S3 or of any server that speaks its API.
    S3 {
        bucket: String,
        /// Prefix of every object name, without leading or trailing `/`.
        #[serde(default)]
        prefix: String,
        /// `http://host:port` or `https://…` for servers other than AWS;
        /// plain HTTP is allowed only when the endpoint says so.
        #[serde(default)]
        endpoint: Option<String>,
        /// Defaults to `AWS_DEFAULT_REGION`, else `us-east-1`.
        #[serde(default)]
        region: Option<String>,
        /// Credentials; when absent, `AWS_ACCESS_KEY_ID` and
        /// `AWS_SECRET_ACCESS_KEY` (and the other `AWS_*` variables).
        #[serde(default)]
        access_key_id: Option<String>,
        #[serde(default)]
        secret_access_key: Option<String>,
    },
}

impl RemoteStorageConfig {
    /// One line for status pages and logs: the directory, or an `s3://` URL
    /// (with the endpoint when it is not AWS). Never the credentials.
    pub fn describe(&self) -> String {
        match self {
            RemoteStorageConfig::Local { path } => path.display().to_string(),
            RemoteStorageConfig::S3 { bucket, prefix, endpoint, .. } => {
                let prefix = prefix.trim_matches('/');
                let url = if prefix.is_empty() { format!("s3://{bucket}") } else { format!("s3://{bucket}/{prefix}") };
                match endpoint {
                    Some(e) => format!("{url} at {e}"),
                    None => url,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_both_kinds_and_refuses_unknown_fields() {
        let local: RemoteStorageConfig = toml::from_str("type = 'local'\npath = '/srv/strata'").unwrap();
        assert_eq!(local, RemoteStorageConfig::Local { path: "/srv/strata".into() });
        assert_eq!(local.describe(), "/srv/strata");
        let s3: RemoteStorageConfig =
            toml::from_str("type = 's3'\nbucket = 'b'\nprefix = 'p/q'\nendpoint = 'http://127.0.0.1:9000'").unwrap();
        assert_eq!(s3.describe(), "s3://b/p/q at http://127.0.0.1:9000");
        let bare: RemoteStorageConfig = toml::from_str("type = 's3'\nbucket = 'b'").unwrap();
        assert_eq!(bare.describe(), "s3://b");
        for bad in ["type = 'local'", "type = 'ftp'\npath = '/x'", "type = 'local'\npath = '/x'\nbucket = 'b'"] {
            assert!(toml::from_str::<RemoteStorageConfig>(bad).is_err(), "{bad}");
        }
    }
}
