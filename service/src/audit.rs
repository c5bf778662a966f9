//! The audit log: every refusal of a caller, and every call that changes
//! something (any method but GET and HEAD, and every protocol session that
//! proposes WAL), with who made it as its verified token says (scope,
//! tenant, timeline, token id, key id), never the token. One JSON object
//! per line, which log shippers read as they are (`docs/security.md`,
//! "Audit log").
//!
//! Bounded: past [`MAX_AUDIT_FILE_BYTES`] the file is renamed with `.1`
//! appended (replacing the one before) and a new one begun, so a service
//! keeps at most twice that. Written with mode 0600 (the services' umask).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde::Serialize;

use crate::limits::MAX_AUDIT_FILE_BYTES;

/// Who a verified token says the caller is (`crate::auth::identity`); all
/// none for a token that did not verify.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Identity {
    pub scope: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeline_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jti: Option<String>,
    /// A console user's name (`docs/console.md`), beside the scope a
    /// session acts with.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

/// One line of the log.
#[derive(Debug, Serialize)]
pub struct Event<'a> {
    /// Seconds since 1970, with milliseconds.
    pub ts: f64,
    pub service: &'a str,
    /// `http`, `page`, `proposer`, `stream` or `pg`.
    pub interface: &'a str,
    /// What was asked: `POST /v1/tenant/…/location`, `greeting tenant/timeline`.
    pub action: &'a str,
    /// `allowed` or `refused`.
    pub outcome: &'static str,
    /// Why it was refused (a refusal's metric label).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<&'static str>,
    /// What an operation that was allowed came to: its error, or what it
    /// reported (outcomes `done` and `failed`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<&'a str>,
    #[serde(flatten)]
    pub who: Identity,
}

struct AuditLog {
    path: PathBuf,
    service: String,
    file: parking_lot::Mutex<Option<(std::fs::File, u64)>>,
}

static LOG: OnceLock<AuditLog> = OnceLock::new();

/// Opens the process's audit log at `path` for `service` (once per
/// process; a second call is refused).
pub fn open(path: &Path, service: &str) -> std::io::Result<()> {
    let file = open_file(path)?;
    let len = file.metadata()?.len();
    let log = AuditLog {
        path: path.to_path_buf(),
        service: service.to_string(),
        file: parking_lot::Mutex::new(Some((file, len))),
    };
    LOG.set(log).map_err(|_| std::io::Error::other("the audit log is open already"))
}

fn open_file(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new().create(true).append(true).mode(0o600).open(path)
}

/// Records a refusal on `interface` of `action` for `reason` (a refusal's
/// metric label), by `who`.
pub fn refused(interface: &str, action: &str, reason: &'static str, who: Identity) {
    record(interface, action, "refused", Some(reason), who);
}

/// Records an allowed call that changes something, by `who`.
pub fn allowed(interface: &str, action: &str, who: Identity) {
    record(interface, action, "allowed", None, who);
}

/// Records what an allowed operation came to (`done` or `failed`, with
/// `detail`), by `who`: for operations that run long after they were
/// allowed (the console's actions).
pub fn finished(interface: &str, action: &str, ok: bool, detail: &str, who: Identity) {
    let outcome = if ok { "done" } else { "failed" };
    write_event(interface, action, outcome, None, Some(detail), who);
}

fn record(interface: &str, action: &str, outcome: &'static str, reason: Option<&'static str>, who: Identity) {
    write_event(interface, action, outcome, reason, None, who);
}

fn write_event(
    interface: &str,
    action: &str,
    outcome: &'static str,
    reason: Option<&'static str>,
    detail: Option<&str>,
    who: Identity,
) {
    let Some(log) = LOG.get() else { return };
    let ts = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_millis() as f64 / 1000.0);
    let event = Event { ts, service: &log.service, interface, action, outcome, reason, detail, who };
    let mut line = serde_json::to_vec(&event).expect("an audit event serializes");
    line.push(b'\n');
    log.write(&line);
}

impl AuditLog {
    fn write(&self, line: &[u8]) {
        let mut guard = self.file.lock();
        if let Err(e) = self.write_locked(&mut guard, line) {
            // Logged, never fatal: a full disk must not stop the service.
            tracing::error!(file = %self.path.display(), "audit log: {e}");
        }
    }

    fn write_locked(&self, slot: &mut Option<(std::fs::File, u64)>, line: &[u8]) -> std::io::Result<()> {
        if slot.as_ref().is_none_or(|(_, len)| len + line.len() as u64 > MAX_AUDIT_FILE_BYTES) {
            *slot = None;
            if self.path.exists() {
                let mut old = self.path.clone().into_os_string();
                old.push(".1");
                std::fs::rename(&self.path, old)?;
            }
            *slot = Some((open_file(&self.path)?, 0));
        }
        let (file, len) = slot.as_mut().expect("opened above");
        file.write_all(line)?;
        *len += line.len() as u64;
        Ok(())
    }
}

/// Writes `lines` through a log of its own at `path` (for tests of the
/// rotation).
#[cfg(test)]
fn write_through(path: &Path, lines: &[&[u8]]) {
    let log = AuditLog { path: path.to_path_buf(), service: "test".into(), file: parking_lot::Mutex::new(None) };
    for line in lines {
        log.write(line);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_json_lines_without_the_token_and_files_are_bounded() {
        let who = Identity {
            scope: Some("tenant".into()),
            tenant_id: Some("01".repeat(16)),
            timeline_id: None,
            jti: Some("00ff".into()),
            user: None,
        };
        let event = Event {
            ts: 1.5,
            service: "pageserver",
            interface: "http",
            action: "PUT /v1/tenant/x/location",
            outcome: "refused",
            reason: Some("scope"),
            detail: None,
            who,
        };
        let line = serde_json::to_string(&event).unwrap();
        let back: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(back["scope"], "tenant");
        assert_eq!(back["tenant_id"], "01".repeat(16));
        assert_eq!(back["jti"], "00ff");
        assert!(back.get("timeline_id").is_none());
        assert_eq!(back["reason"], "scope");
        assert!(!line.contains('\n'));
        // Nobody: no identity fields but a null scope.
        let nobody = serde_json::to_value(Identity::default()).unwrap();
        assert_eq!(nobody, serde_json::json!({"scope": null}));

        let dir = std::env::temp_dir().join(format!("strata-audit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("audit.jsonl");
        let line = vec![b'x'; 1 << 20];
        let lines: Vec<&[u8]> = (0..40).map(|_| line.as_slice()).collect();
        write_through(&path, &lines);
        let size = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.len());
        let old = dir.join("audit.jsonl.1");
        assert!(size(&path) <= MAX_AUDIT_FILE_BYTES && size(&old) <= MAX_AUDIT_FILE_BYTES);
        assert!(size(&path) + size(&old) >= 2 * (1 << 20));
        let names: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names.len(), 2, "{names:?}");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
