//! The roles of a branch: applications log in over TCP as the endpoint's
//! application role, which owns the database `postgres` and is no
//! superuser; the bootstrap superuser has no password and logs in through
//! the Unix socket only (its TCP logins are refused by `pg_hba.conf`), so
//! it stays with the agent (`docs/security.md`, "Roles").
//!
//! At every start of a primary the agent reads what the catalog holds and
//! changes only what differs, so a start that finds everything in place
//! writes no WAL. The changes are catalog changes, WAL-logged like any
//! other: they belong to the branch from then on, and a standby (which
//! cannot write) only checks the login and warns.

use tracing::{info, warn};

use super::{fail, AgentError};
use crate::pg_replication::{ReplicationConfig, ReplicationConnection};

/// SQLSTATE `invalid_password`: the role has another password, none, or
/// does not exist (PostgreSQL does not say which).
const SQLSTATE_INVALID_PASSWORD: &str = "28P01";

/// What the catalog says of the two roles and of the database's owner.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RoleState {
    /// The application role's attributes; none: it does not exist.
    pub app: Option<Attributes>,
    /// Whether the superuser has a password (it must have none).
    pub superuser_has_password: bool,
    /// The owner of the database `postgres`; none: no such database.
    pub database_owner: Option<String>,
    /// The roles the application role is a member of (directly).
    pub member_of: Vec<String>,
    /// The application role's password verifier as the catalog holds it.
    pub app_verifier: Option<String>,
}

/// Predefined roles the application role is given: statistics, CHECKPOINT
/// and cancelling its own sessions, what a database's owner runs on a
/// server of its own; none reads or writes files or runs programs.
pub const GRANTED: [&str; 3] = ["pg_checkpoint", "pg_monitor", "pg_signal_backend"];

/// Predefined roles that reach the server's files or shell (as the
/// operating-system user every compute of the host shares): taken back
/// if somebody gave them.
pub const REFUSED: [&str; 3] = ["pg_execute_server_program", "pg_read_server_files", "pg_write_server_files"];

/// The attributes of a role that decide what it may do.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Attributes {
    pub superuser: bool,
    pub create_role: bool,
    pub replication: bool,
    pub bypass_rls: bool,
    pub login: bool,
    pub create_db: bool,
}

impl Attributes {
    /// The application role's: it logs in and creates databases, and can
    /// neither bypass permissions nor make roles (on PostgreSQL 15,
    /// CREATEROLE may grant `pg_execute_server_program`, a shell).
    const WANTED: Attributes = Attributes {
        superuser: false,
        create_role: false,
        replication: false,
        bypass_rls: false,
        login: true,
        create_db: true,
    };
}

/// The names of the two roles (checked role names, see
/// [`super::config::check_role_name`]).
#[derive(Clone, Copy, Debug)]
pub struct Names<'a> {
    pub app: &'a str,
    pub superuser: &'a str,
}

/// The statements that make `state` what it must be; `verifier`: the
/// application role's password must be set to this SCRAM verifier. Empty
/// when nothing differs.
pub fn changes(state: &RoleState, names: Names<'_>, verifier: Option<&str>) -> Vec<String> {
    let (app, su) = (names.app, names.superuser);
    let wanted = "LOGIN CREATEDB NOSUPERUSER NOCREATEROLE NOREPLICATION NOBYPASSRLS";
    let mut out = Vec::new();
    match (&state.app, verifier) {
        // A new role gets its password at once (the verifier is needed anyway).
        (None, v) => {
            let password = v.map(|v| format!(" PASSWORD '{v}'")).unwrap_or_default();
            out.push(format!("CREATE ROLE \"{app}\" {wanted}{password}"));
        }
        (Some(attrs), v) => {
            if *attrs != Attributes::WANTED {
                out.push(format!("ALTER ROLE \"{app}\" {wanted}"));
            }
            if let Some(v) = v {
                out.push(format!("ALTER ROLE \"{app}\" PASSWORD '{v}'"));
            }
        }
    }
    let missing: Vec<&str> = GRANTED.iter().copied().filter(|r| !state.member_of.iter().any(|m| m == r)).collect();
    if !missing.is_empty() {
        out.push(format!("GRANT {} TO \"{app}\"", missing.join(", ")));
    }
    let held: Vec<&str> = REFUSED.iter().copied().filter(|r| state.member_of.iter().any(|m| m == r)).collect();
    if !held.is_empty() {
        out.push(format!("REVOKE {} FROM \"{app}\"", held.join(", ")));
    }
    if state.superuser_has_password {
        out.push(format!("ALTER ROLE \"{su}\" PASSWORD NULL"));
    }
    if state.database_owner.as_deref().is_some_and(|o| o != app) {
        out.push(format!("ALTER DATABASE postgres OWNER TO \"{app}\""));
    }
    out
}

/// The catalog query whose rows [`parse_state`] reads (its second column
/// is text, not `name`: a verifier is longer than a name's 63 bytes): one row per role
/// (`role`, name, six attributes, has a password), one for the database
/// (`database`, owner) and one per role the application role is a member
/// of (`member`, that role).
pub fn state_query(names: Names<'_>) -> String {
    let (app, su) = (names.app, names.superuser);
    format!(
        "SELECT 'role', rolname::text, rolsuper, rolcreaterole, rolreplication, rolbypassrls, rolcanlogin, \
         rolcreatedb, rolpassword IS NOT NULL FROM pg_authid WHERE rolname IN ('{app}', '{su}') \
         UNION ALL SELECT 'database', pg_get_userbyid(datdba)::text, NULL, NULL, NULL, NULL, NULL, NULL, NULL \
         FROM pg_database WHERE datname = 'postgres' \
         UNION ALL SELECT 'member', pg_get_userbyid(m.roleid)::text, NULL, NULL, NULL, NULL, NULL, NULL, NULL \
         FROM pg_auth_members m JOIN pg_authid a ON a.oid = m.member WHERE a.rolname = '{app}' \
         UNION ALL SELECT 'verifier', rolpassword, NULL, NULL, NULL, NULL, NULL, NULL, NULL \
         FROM pg_authid WHERE rolname = '{app}' AND rolpassword IS NOT NULL"
    )
}

/// Reads the rows of [`state_query`]; an unexpected row is an error.
pub fn parse_state(rows: &[Vec<Option<String>>], names: Names<'_>) -> Result<RoleState, String> {
    let flag = |row: &[Option<String>], i: usize| -> Result<bool, String> {
        match row.get(i).and_then(|v| v.as_deref()) {
            Some("t") => Ok(true),
            Some("f") => Ok(false),
            other => Err(format!("column {i} of {row:?}: {other:?} is not a boolean")),
        }
    };
    let mut state = RoleState::default();
    for row in rows {
        let kind = row.first().and_then(|v| v.as_deref());
        let name = row.get(1).and_then(|v| v.as_deref());
        match (kind, name) {
            (Some("role"), Some(n)) if n == names.app => {
                state.app = Some(Attributes {
                    superuser: flag(row, 2)?,
                    create_role: flag(row, 3)?,
                    replication: flag(row, 4)?,
                    bypass_rls: flag(row, 5)?,
                    login: flag(row, 6)?,
                    create_db: flag(row, 7)?,
                });
            }
            (Some("role"), Some(n)) if n == names.superuser => state.superuser_has_password = flag(row, 8)?,
            (Some("database"), Some(owner)) => state.database_owner = Some(owner.to_string()),
            (Some("member"), Some(role)) => state.member_of.push(role.to_string()),
            (Some("verifier"), Some(v)) => state.app_verifier = Some(v.to_string()),
            _ => return Err(format!("unexpected row {row:?}")),
        }
    }
    Ok(state)
}

/// Makes the branch's roles what they must be (a primary) or checks the
/// application role's login (a standby, which cannot change them and only
/// warns). `tcp`: the application role's login with the endpoint's
/// password; `socket`: the superuser's session through the Unix socket;
/// `wanted`: the endpoint's own SCRAM verifier of that password, which the
/// role must have exactly (the proxy logs in with it, `docs/proxy.md`);
/// without one, a verifier is made when the password does not log in.
pub async fn ensure(
    tcp: &ReplicationConfig,
    socket: &ReplicationConfig,
    names: Names<'_>,
    standby: bool,
    wanted: Option<&str>,
) -> Result<(), AgentError> {
    let password = tcp.password.as_deref().unwrap_or_default();
    let logs_in = match ReplicationConnection::connect(tcp).await {
        Ok(_) => true,
        Err(e) if e.code() == Some(SQLSTATE_INVALID_PASSWORD) => false,
        Err(e) => return Err(fail("roles", format!("logging in as {}: {e}", names.app))),
    };
    if standby {
        if !logs_in {
            warn!(
                role = names.app,
                "the role's password in the branch is not this endpoint's; a standby cannot set it"
            );
        }
        return Ok(());
    }
    let mut conn = ReplicationConnection::connect(socket)
        .await
        .map_err(|e| fail("roles", format!("connecting through the socket: {e}")))?;
    let rows =
        conn.simple_query(&state_query(names)).await.map_err(|e| fail("roles", format!("reading the roles: {e}")))?;
    let state = parse_state(&rows, names).map_err(|e| fail("roles", format!("reading the roles: {e}")))?;
    let verifier = match wanted {
        // The endpoint's own verifier (the proxy holds it too): set unless
        // the catalog has exactly it.
        Some(v) => (state.app_verifier.as_deref() != Some(v)).then(|| v.to_string()),
        None => (!logs_in).then(|| postgres_protocol::password::scram_sha_256(password.as_bytes())),
    };
    let statements = changes(&state, names, verifier.as_deref());
    if statements.is_empty() {
        return Ok(());
    }
    // Local durability is enough and must not wait: the WAL proposer, the
    // synchronous standby, is not streaming yet.
    let sql = format!("SET synchronous_commit = local; {}", statements.join("; "));
    conn.simple_query(&sql).await.map_err(|e| fail("roles", format!("changing the roles: {e}")))?;
    ReplicationConnection::connect(tcp)
        .await
        .map_err(|e| fail("roles", format!("logging in as {} after the change: {e}", names.app)))?;
    // What changed, never the verifier.
    let changed: Vec<&str> = statements.iter().map(|s| s.split(" PASSWORD '").next().unwrap_or(s)).collect();
    info!(app = names.app, superuser = names.superuser, ?changed, "the branch's roles made the endpoint's");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const NAMES: Names<'static> = Names { app: "app", superuser: "postgres" };

    fn row(cells: &[&str]) -> Vec<Option<String>> {
        cells.iter().map(|c| if *c == "NULL" { None } else { Some(c.to_string()) }).collect()
    }

    #[test]
    fn a_fresh_branch_gets_the_role_the_ownership_and_a_superuser_without_password() {
        let rows = vec![
            row(&["role", "postgres", "t", "t", "t", "t", "t", "t", "t"]),
            row(&["database", "postgres", "NULL", "NULL", "NULL", "NULL", "NULL", "NULL", "NULL"]),
        ];
        let state = parse_state(&rows, NAMES).unwrap();
        assert_eq!(state.app, None);
        assert!(state.superuser_has_password);
        assert_eq!(
            changes(&state, NAMES, Some("SCRAM-SHA-256$4096:x$y:z")),
            vec![
                "CREATE ROLE \"app\" LOGIN CREATEDB NOSUPERUSER NOCREATEROLE NOREPLICATION NOBYPASSRLS \
                 PASSWORD 'SCRAM-SHA-256$4096:x$y:z'",
                "GRANT pg_checkpoint, pg_monitor, pg_signal_backend TO \"app\"",
                "ALTER ROLE \"postgres\" PASSWORD NULL",
                "ALTER DATABASE postgres OWNER TO \"app\"",
            ]
        );
    }

    #[test]
    fn a_branch_in_order_needs_nothing_and_drifted_attributes_are_put_back() {
        let good = vec![
            row(&["role", "app", "f", "f", "f", "f", "t", "t", "t"]),
            row(&["role", "postgres", "t", "t", "t", "t", "t", "t", "f"]),
            row(&["database", "app", "NULL", "NULL", "NULL", "NULL", "NULL", "NULL", "NULL"]),
            row(&["member", "pg_monitor", "NULL", "NULL", "NULL", "NULL", "NULL", "NULL", "NULL"]),
            row(&["member", "pg_checkpoint", "NULL", "NULL", "NULL", "NULL", "NULL", "NULL", "NULL"]),
            row(&["member", "pg_signal_backend", "NULL", "NULL", "NULL", "NULL", "NULL", "NULL", "NULL"]),
        ];
        let state = parse_state(&good, NAMES).unwrap();
        assert_eq!(state.app, Some(Attributes::WANTED));
        assert!(changes(&state, NAMES, None).is_empty());
        // Made a superuser behind the agent's back, given a shell and
        // denied a grant: all taken back at the next start.
        let mut drifted = good.clone();
        drifted[0] = row(&["role", "app", "t", "f", "t", "f", "t", "t", "t"]);
        drifted[3] =
            row(&["member", "pg_execute_server_program", "NULL", "NULL", "NULL", "NULL", "NULL", "NULL", "NULL"]);
        let state = parse_state(&drifted, NAMES).unwrap();
        assert_eq!(
            changes(&state, NAMES, Some("v")),
            vec![
                "ALTER ROLE \"app\" LOGIN CREATEDB NOSUPERUSER NOCREATEROLE NOREPLICATION NOBYPASSRLS",
                "ALTER ROLE \"app\" PASSWORD 'v'",
                "GRANT pg_monitor TO \"app\"",
                "REVOKE pg_execute_server_program FROM \"app\"",
            ]
        );
    }

    #[test]
    fn unexpected_rows_are_errors_not_guesses() {
        for bad in [
            vec![row(&["role", "somebody", "f", "f", "f", "f", "t", "t", "t"])],
            vec![row(&["role", "app", "yes", "f", "f", "f", "t", "t", "t"])],
            vec![row(&["role", "app", "f"])],
            vec![row(&["table", "x"])],
            vec![vec![None]],
        ] {
            assert!(parse_state(&bad, NAMES).is_err(), "{bad:?}");
        }
        // No database `postgres` (dropped): nothing to give.
        let mut rows = vec![row(&["role", "app", "f", "f", "f", "f", "t", "t", "f"])];
        rows.extend(GRANTED.map(|r| row(&["member", r])));
        let state = parse_state(&rows, NAMES).unwrap();
        assert!(changes(&state, NAMES, None).is_empty());
        // The role's verifier as the catalog holds it.
        let with = vec![row(&[
            "verifier",
            "SCRAM-SHA-256$4096:x$y:z",
            "NULL",
            "NULL",
            "NULL",
            "NULL",
            "NULL",
            "NULL",
            "NULL",
        ])];
        assert_eq!(parse_state(&with, NAMES).unwrap().app_verifier.as_deref(), Some("SCRAM-SHA-256$4096:x$y:z"));
    }
}
