//! How a process ended, in words: `exit code 1`, `signal 9: SIGKILL`.

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;

/// The agent's exit code when another writer took its branch over: its
/// supervisor then stops instead of starting it again, which would take
/// the branch back (`docs/replicas.md`, "Promotion").
pub const FENCED: i32 = 78;

/// The agent's exit code when it suspended the compute after its idle
/// period (`docs/compute.md`, "Suspend"): PostgreSQL stopped cleanly and
/// nothing of the compute is left; its supervisor then stops too, and the
/// next `strata endpoint start` wakes it.
pub const SUSPENDED: i32 = 79;

/// The exit code of a follower (`strata compute proposer --follow-end`)
/// once the relay it followed stopped and a quorum of safekeepers holds
/// all the WAL it sent: the cut-over of a streaming import
/// (`docs/import.md`); its supervisor then stops too.
pub const SOURCE_ENDED: i32 = 80;

/// The conventional name of a signal (`SIGKILL`), or `SIG<n>`.
pub fn signal_name(signal: i32) -> String {
    let name = match signal {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        libc::SIGSYS => "SIGSYS",
        _ => return format!("SIG{signal}"),
    };
    name.to_string()
}

/// `exit code N`, or `signal N: NAME` (with `, core dumped` if it did).
pub fn describe(status: ExitStatus) -> String {
    if let Some(code) = status.code() {
        return format!("exit code {code}");
    }
    match status.signal() {
        Some(sig) => {
            let core = if status.core_dumped() { ", core dumped" } else { "" };
            format!("signal {sig}: {}{core}", signal_name(sig))
        }
        None => status.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describes_exits_and_signals() {
        assert_eq!(describe(ExitStatus::from_raw(0)), "exit code 0");
        assert_eq!(describe(ExitStatus::from_raw(1 << 8)), "exit code 1");
        assert_eq!(describe(ExitStatus::from_raw(libc::SIGKILL)), "signal 9: SIGKILL");
        assert_eq!(describe(ExitStatus::from_raw(libc::SIGSEGV | 0x80)), "signal 11: SIGSEGV, core dumped");
        assert_eq!(signal_name(64), "SIG64");
    }
}
