//! Failure points: named places where a test makes a process fail on
//! purpose, to show that what it was doing either completes or rolls back
//! (`docs/testing.md`, "Failure points").
//!
//! They are set by the environment variable `STRATA_FAILPOINTS`: a
//! comma-separated list of `name=action`, where the action is `exit` (the
//! process ends at once, as under `kill -9`: nothing is flushed or cleaned
//! up) or `error` (the step fails as if object storage had failed). A
//! value `@FILE` names a file holding that list, read at every point
//! reached (missing: no points), so that a test sets and clears points
//! while the services run and after their supervisor restarts them.
//! Unset, every point is a no-op costing one lookup.

use std::collections::HashMap;
use std::sync::OnceLock;

/// The variable that sets them.
pub const VARIABLE: &str = "STRATA_FAILPOINTS";

/// What a failure point does when reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Ends the process at once (exit code 86).
    Exit,
    /// Makes the step fail with an error.
    Error,
}

/// The exit code of a process ended by a failure point.
pub const EXIT_CODE: i32 = 86;

fn parse(spec: &str) -> Result<HashMap<String, Action>, String> {
    let mut out = HashMap::new();
    for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (name, action) = item.split_once('=').ok_or_else(|| format!("{item:?}: expected name=exit|error"))?;
        let action = match action {
            "exit" => Action::Exit,
            "error" => Action::Error,
            other => return Err(format!("{name}: unknown action {other:?} (exit or error)")),
        };
        out.insert(name.to_string(), action);
    }
    Ok(out)
}

/// What the variable says: the points, or the file that lists them.
enum Source {
    Points(HashMap<String, Action>),
    File(std::path::PathBuf),
}

/// A spec that cannot be read ends the process: a test that sets a point
/// it misspells must not pass unnoticed.
fn parsed_or_exit(spec: &str) -> HashMap<String, Action> {
    parse(spec).unwrap_or_else(|e| {
        eprintln!("{VARIABLE}: {e}");
        std::process::exit(2);
    })
}

fn source() -> &'static Source {
    static SOURCE: OnceLock<Source> = OnceLock::new();
    SOURCE.get_or_init(|| match std::env::var(VARIABLE) {
        Ok(spec) => match spec.strip_prefix('@') {
            Some(path) => Source::File(path.into()),
            None => Source::Points(parsed_or_exit(&spec)),
        },
        Err(_) => Source::Points(HashMap::new()),
    })
}

fn action(name: &str) -> Option<Action> {
    match source() {
        Source::Points(p) => p.get(name).copied(),
        Source::File(path) => {
            let spec = std::fs::read_to_string(path).unwrap_or_default();
            parsed_or_exit(&spec).get(name).copied()
        }
    }
}

/// Reaches the failure point `name`: ends the process or returns an
/// error if the environment says so, else nothing.
pub fn hit(name: &str) -> Result<(), String> {
    match action(name) {
        None => Ok(()),
        Some(Action::Error) => {
            tracing::warn!(failpoint = name, "failing on purpose");
            Err(format!("failure point {name}"))
        }
        Some(Action::Exit) => {
            tracing::warn!(failpoint = name, "exiting on purpose");
            eprintln!("failure point {name}: exiting");
            std::process::exit(EXIT_CODE);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_bad_ones_are_refused() {
        let p = parse(" a=exit, b=error ,").unwrap();
        assert_eq!((p["a"], p["b"], p.len()), (Action::Exit, Action::Error, 2));
        assert!(parse("a").unwrap_err().contains("name=exit|error"));
        assert!(parse("a=boom").unwrap_err().contains("unknown action"));
        assert!(parse("").unwrap().is_empty());
        // No variable in the test environment: every point passes.
        assert!(hit("split-nowhere").is_ok());
    }
}
