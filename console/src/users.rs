//! The console's users (`console/users.json`, mode 0600): a name, a role,
//! the tenants it may see (all when absent) and a salted PBKDF2 hash of
//! the password. `strata console user add|remove|list` keeps the file; the
//! console reads it at each login, so a removed user logs in no more.

use std::num::NonZeroU32;
use std::path::{Path, PathBuf};

use aws_lc_rs::{pbkdf2, rand};

use crate::limits::{MAX_USERS, MIN_PASSWORD_LEN, PASSWORD_ROUNDS};

/// The file's format version.
pub const USERS_VERSION: u32 = 1;
/// The console's directory in the workdir (mode 0700).
pub const CONSOLE_DIR: &str = "console";

/// What a user may do (`docs/console.md`, "Who may log in").
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Sees its tenants; no action, no SQL.
    Viewer,
    /// Sees its tenants, acts on them and runs SQL on their endpoints.
    Operator,
    /// A session of a management token: everything, the audit log included.
    Admin,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }

    /// `viewer` or `operator`: the roles a stored user may have.
    pub fn parse_stored(text: &str) -> Result<Role, String> {
        match text {
            "viewer" => Ok(Role::Viewer),
            "operator" => Ok(Role::Operator),
            _ => Err(format!("role {text:?}: viewer or operator (an admin logs in with a management token)")),
        }
    }
}

/// One user as the file keeps it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct User {
    pub name: String,
    pub role: Role,
    /// The tenants it may see and act on; none: every tenant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenants: Option<Vec<String>>,
    /// `pbkdf2-sha256$ROUNDS$SALT$HASH` (hex).
    pub password: String,
    /// Unix seconds.
    pub created_at: u64,
}

#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct UsersFile {
    version: u32,
    users: Vec<User>,
}

/// The users file of the workdir at `root`.
pub fn users_file(root: &Path) -> PathBuf {
    root.join(CONSOLE_DIR).join("users.json")
}

/// Every user (none when the file does not exist).
pub fn load(root: &Path) -> Result<Vec<User>, String> {
    let path = users_file(root);
    let bytes = match strata_service::auth::read_private(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let file: UsersFile = serde_json::from_slice(&bytes).map_err(|e| format!("{}: {e}", path.display()))?;
    if file.version != USERS_VERSION {
        return Err(format!("{}: version {} (this console reads {USERS_VERSION})", path.display(), file.version));
    }
    if file.users.len() > MAX_USERS {
        return Err(format!("{}: more than {MAX_USERS} users", path.display()));
    }
    Ok(file.users)
}

fn save(root: &Path, users: Vec<User>) -> Result<(), String> {
    let dir = root.join(CONSOLE_DIR);
    create_private_dir(&dir)?;
    let text = serde_json::to_string_pretty(&UsersFile { version: USERS_VERSION, users }).expect("users serialize");
    strata_service::auth::write_secret(&users_file(root), &(text + "\n")).map_err(|e| e.to_string())
}

/// Makes the console's directory, private to its user.
pub fn create_private_dir(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(|e| format!("{}: {e}", dir.display()))
}

/// User names go into logs and the audit log: keep them plain.
pub fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '@'));
    match ok {
        true => Ok(()),
        false => Err(format!("invalid user name {name:?}: letters, digits, '-', '_', '.', '@' (at most 63)")),
    }
}

/// Adds `name`, or gives an existing user a new password, role and tenants.
/// Whether the user existed.
pub fn set(root: &Path, name: &str, role: Role, tenants: Option<Vec<String>>, password: &str) -> Result<bool, String> {
    check_name(name)?;
    if role == Role::Admin {
        return Err("an admin logs in with a management token; a stored user is a viewer or an operator".into());
    }
    if password.chars().count() < MIN_PASSWORD_LEN {
        return Err(format!("the password must have at least {MIN_PASSWORD_LEN} characters"));
    }
    let mut users = load(root)?;
    let user = User {
        name: name.to_string(),
        role,
        tenants,
        password: hash(password, PASSWORD_ROUNDS),
        created_at: strata_service::auth::now(),
    };
    let existed = match users.iter().position(|u| u.name == name) {
        Some(i) => {
            users[i] = user;
            true
        }
        None if users.len() >= MAX_USERS => return Err(format!("at most {MAX_USERS} users")),
        None => {
            users.push(user);
            false
        }
    };
    save(root, users)?;
    Ok(existed)
}

/// Removes `name`; whether it was there.
pub fn remove(root: &Path, name: &str) -> Result<bool, String> {
    let mut users = load(root)?;
    let before = users.len();
    users.retain(|u| u.name != name);
    let removed = users.len() != before;
    if removed {
        save(root, users)?;
    }
    Ok(removed)
}

/// The user `name` if `password` is its password. The hash is checked in
/// constant time, and a name that does not exist costs a hash too, so
/// that neither the time nor the answer tells which names exist.
pub fn check_password(root: &Path, name: &str, password: &str) -> Result<Option<User>, String> {
    let users = load(root)?;
    match users.into_iter().find(|u| u.name == name) {
        Some(u) => Ok(verify(&u.password, password).then_some(u)),
        None => {
            let _ = verify(&hash("", PASSWORD_ROUNDS), password);
            Ok(None)
        }
    }
}

const SALT_LEN: usize = 16;
const HASH_LEN: usize = 32;

/// `pbkdf2-sha256$ROUNDS$SALT$HASH` of `password` with a random salt.
pub fn hash(password: &str, rounds: u32) -> String {
    let mut salt = [0u8; SALT_LEN];
    rand::fill(&mut salt).expect("the system's random numbers");
    let rounds_nz = NonZeroU32::new(rounds.max(1)).expect("at least one round");
    let mut out = [0u8; HASH_LEN];
    pbkdf2::derive(pbkdf2::PBKDF2_HMAC_SHA256, rounds_nz, &salt, password.as_bytes(), &mut out);
    format!("pbkdf2-sha256${rounds}${}${}", hex(&salt), hex(&out))
}

/// Whether `password` matches `stored` (malformed: no).
pub fn verify(stored: &str, password: &str) -> bool {
    let parts: Vec<&str> = stored.split('$').collect();
    let [scheme, rounds, salt, expected] = parts.as_slice() else { return false };
    if *scheme != "pbkdf2-sha256" {
        return false;
    }
    let (Some(rounds), Some(salt), Some(expected)) =
        (rounds.parse::<u32>().ok().and_then(NonZeroU32::new), unhex(salt), unhex(expected))
    else {
        return false;
    };
    // A file with a huge count would make every login a denial of service.
    if rounds.get() > 10 * PASSWORD_ROUNDS || expected.len() != HASH_LEN {
        return false;
    }
    pbkdf2::verify(pbkdf2::PBKDF2_HMAC_SHA256, rounds, &salt, password.as_bytes(), &expected).is_ok()
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || text.len() > 256 {
        return None;
    }
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_password_verifies_and_nothing_else_does() {
        let stored = hash("correct horse battery", 1000);
        assert!(verify(&stored, "correct horse battery"));
        assert!(!verify(&stored, "correct horse batterY"));
        assert!(!verify(&stored, ""));
        // Two hashes of one password differ (salt).
        assert_ne!(stored, hash("correct horse battery", 1000));
        for bad in ["", "pbkdf2-sha256$1000$zz$00", "md5$1$00$00", "pbkdf2-sha256$0$00$00", "a$b$c"] {
            assert!(!verify(bad, "x"), "{bad}");
        }
        let huge = stored.replacen("$1000$", "$4000000000$", 1);
        assert!(!verify(&huge, "correct horse battery"));
    }

    #[test]
    fn the_file_is_private_and_names_roles_and_lengths_are_checked() {
        let dir = std::env::temp_dir().join(format!("strata-console-users-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        assert!(load(&dir).unwrap().is_empty());
        assert!(set(&dir, "alice", Role::Operator, None, "short").unwrap_err().contains("at least"));
        assert!(set(&dir, "al ice", Role::Operator, None, "long enough password").is_err());
        assert!(set(&dir, "root", Role::Admin, None, "long enough password").is_err());
        assert!(!set(&dir, "alice", Role::Operator, Some(vec!["t1".into()]), "long enough password").unwrap());
        assert!(set(&dir, "alice", Role::Viewer, None, "another long password").unwrap());
        let users = load(&dir).unwrap();
        assert_eq!(users.len(), 1);
        assert_eq!(users[0].role, Role::Viewer);
        assert!(check_password(&dir, "alice", "another long password").unwrap().is_some());
        assert!(check_password(&dir, "alice", "long enough password").unwrap().is_none());
        assert!(check_password(&dir, "bob", "another long password").unwrap().is_none());
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&users_file(&dir)), 0o600);
        assert_eq!(mode(&dir.join(CONSOLE_DIR)), 0o700);
        assert!(remove(&dir, "alice").unwrap());
        assert!(!remove(&dir, "alice").unwrap());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
