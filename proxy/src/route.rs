//! Which endpoint a client asks for: the first label of the TLS server
//! name (`ep1.<domain>`), or `endpoint=NAME` in the startup packet's
//! `options` for a client that sends no server name. The option is taken
//! out before the session reaches the compute, which would refuse it.

/// A client's session as the compute will see it.
#[derive(Debug, PartialEq)]
pub struct Route {
    pub endpoint: String,
    pub user: String,
    /// The startup parameters passed on (the endpoint option and the
    /// protocol's `_pq_.` extensions taken out).
    pub params: Vec<(String, String)>,
}

/// Why a startup packet names no endpoint the proxy can look for.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum RouteError {
    #[error("no user name in the startup packet")]
    NoUser,
    #[error(
        "no endpoint named: connect to <endpoint>.{0} (the server name's first label) or give options=endpoint=<name>"
    )]
    NoEndpoint(String),
    #[error("the server name names endpoint {sni:?} and options name {option:?}")]
    Conflict { sni: String, option: String },
    #[error("{0:?} is no endpoint name (letters, digits, '-' and '_', at most 63)")]
    BadName(String),
}

/// The endpoint from a server name `<label>.<domain>` (case aside).
fn from_server_name(sni: &str, domain: &str) -> Option<String> {
    let (label, rest) = sni.split_once('.')?;
    rest.eq_ignore_ascii_case(domain).then(|| label.to_string())
}

/// `options` split on unescaped spaces (`\ ` is a space within a word, as
/// PostgreSQL reads them), each word kept as written.
fn words(options: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (bytes, mut start, mut escaped) = (options.as_bytes(), None, false);
    for (i, &b) in bytes.iter().enumerate() {
        match (escaped, b) {
            (true, _) => escaped = false,
            (false, b'\\') => {
                escaped = true;
                start.get_or_insert(i);
            }
            (false, b) if b.is_ascii_whitespace() => {
                if let Some(s) = start.take() {
                    out.push(&options[s..i]);
                }
            }
            _ => {
                start.get_or_insert(i);
            }
        }
    }
    if let Some(s) = start {
        out.push(&options[s..]);
    }
    out
}

fn check_name(name: &str) -> Result<(), RouteError> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && !name.starts_with('-')
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(RouteError::BadName(name.to_string()))
    }
}

/// The route of a startup packet with `params`, over TLS with server name
/// `sni` (if any).
pub fn route(sni: Option<&str>, domain: &str, params: Vec<(String, String)>) -> Result<Route, RouteError> {
    let mut user = None;
    let mut option = None;
    let mut passed = Vec::with_capacity(params.len());
    for (name, value) in params {
        match name.as_str() {
            "user" => user = Some(value.clone()),
            "options" => {
                let mut kept = Vec::new();
                for w in words(&value) {
                    match w.strip_prefix("endpoint=") {
                        Some(e) => option = Some(e.to_string()),
                        None => kept.push(w),
                    }
                }
                if !kept.is_empty() {
                    passed.push((name, kept.join(" ")));
                }
                continue;
            }
            n if n.starts_with("_pq_.") => continue,
            _ => {}
        }
        passed.push((name, value));
    }
    let user = user.filter(|u| !u.is_empty()).ok_or(RouteError::NoUser)?;
    let from_sni = sni.and_then(|s| from_server_name(s, domain));
    let endpoint = match (from_sni, option) {
        (Some(s), Some(o)) if s != o => return Err(RouteError::Conflict { sni: s, option: o }),
        (Some(e), _) | (None, Some(e)) => e,
        (None, None) => return Err(RouteError::NoEndpoint(domain.to_string())),
    };
    check_name(&endpoint)?;
    Ok(Route { endpoint, user, params: passed })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect()
    }

    #[test]
    fn the_server_name_names_the_endpoint() {
        let r = route(Some("ep1.db.localhost"), "db.localhost", params(&[("user", "app"), ("database", "x")])).unwrap();
        assert_eq!(r.endpoint, "ep1");
        assert_eq!(r.user, "app");
        assert_eq!(r.params, params(&[("user", "app"), ("database", "x")]));
        // Another domain, the domain itself, or two labels more: no endpoint.
        for sni in ["ep1.example.com", "db.localhost", "a.ep1.db.localhost"] {
            let e = route(Some(sni), "db.localhost", params(&[("user", "app")])).unwrap_err();
            assert!(matches!(e, RouteError::NoEndpoint(_)), "{sni}: {e}");
        }
    }

    #[test]
    fn options_name_the_endpoint_and_lose_it() {
        let p = params(&[("user", "app"), ("options", "-c search_path=a\\ b endpoint=ep-2  -c x=y"), ("_pq_.z", "1")]);
        let r = route(None, "d", p).unwrap();
        assert_eq!(r.endpoint, "ep-2");
        assert_eq!(r.params, params(&[("user", "app"), ("options", "-c search_path=a\\ b -c x=y")]));
        let only = route(None, "d", params(&[("user", "app"), ("options", "endpoint=e")])).unwrap();
        assert_eq!(only.params, params(&[("user", "app")]));
        // Both, agreeing or not.
        let both = params(&[("user", "app"), ("options", "endpoint=ep1")]);
        assert_eq!(route(Some("ep1.d"), "d", both.clone()).unwrap().endpoint, "ep1");
        assert!(matches!(route(Some("ep2.d"), "d", both), Err(RouteError::Conflict { .. })));
    }

    #[test]
    fn bad_requests_are_named() {
        assert_eq!(route(Some("ep1.d"), "d", params(&[("database", "x")])), Err(RouteError::NoUser));
        let bad = params(&[("user", "app"), ("options", "endpoint=../x")]);
        assert!(matches!(route(None, "d", bad), Err(RouteError::BadName(_))));
        let empty = params(&[("user", "app"), ("options", "endpoint=")]);
        assert!(matches!(route(None, "d", empty), Err(RouteError::BadName(_))));
    }
}
