//! The CLI's output: every line of every command goes through here, so
//! that a closed stdout (`strata start | head -1`) never panics the way
//! `println!` does.
//!
//! When the reader is gone (EPIPE; Rust ignores SIGPIPE, so the write
//! fails instead of killing the process), the rest of the output is
//! dropped and the command runs to its end, then exits with
//! [`READER_GONE_EXIT`], 141, the status a shell reports for a command
//! killed by SIGPIPE, so that a script with `pipefail` learns its output
//! was cut, and nothing is printed about it. Ending at once would be the
//! usual way, but it leaves a `start` or a `stop` half done (services of
//! one kind started, the rest not) for the sake of lines nobody reads. Any
//! other write failure (a full disk) is said once on stderr, if it can be,
//! and the command exits 1. A command that failed keeps its own status.

use std::fmt;
use std::io::{self, Write};
use std::sync::OnceLock;

use strata_control_plane::report::{Event, Progress};

/// The exit status when stdout or stderr lost its reader: 128 + SIGPIPE.
pub const READER_GONE_EXIT: i32 = 128 + libc::SIGPIPE;

/// Why a line could not be written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Failure {
    /// The other end of the pipe is closed.
    ReaderGone,
    Other(String),
}

/// The first failed write of each stream: nothing more is written to it.
static STDOUT_FAILED: OnceLock<Failure> = OnceLock::new();
static STDERR_FAILED: OnceLock<Failure> = OnceLock::new();

/// Writes `args` and a newline to `w` and flushes it.
pub fn write_line(w: &mut impl Write, args: fmt::Arguments<'_>) -> Result<(), Failure> {
    write_text(w, format_args!("{args}\n"))
}

/// Writes `args` as they are to `w` and flushes it.
pub fn write_text(w: &mut impl Write, args: fmt::Arguments<'_>) -> Result<(), Failure> {
    w.write_fmt(args).and_then(|()| w.flush()).map_err(|e| match e.kind() {
        io::ErrorKind::BrokenPipe => Failure::ReaderGone,
        _ => Failure::Other(e.to_string()),
    })
}

/// Writes to stdout or stderr unless an earlier write to it failed;
/// remembers the first failure (and says what it was, unless the reader is gone).
fn emit(failed: &OnceLock<Failure>, what: &str, write: impl FnOnce() -> Result<(), Failure>) {
    if failed.get().is_some() {
        return;
    }
    if let Err(failure) = write() {
        if let Failure::Other(e) = &failure {
            if what == "stdout" {
                // Said once, on stderr if it still takes it.
                error_line(format_args!("strata: writing to {what}: {e}"));
            }
        }
        let _ = failed.set(failure);
    }
}

/// The process's exit status: the command's own unless it succeeded while
/// its output was lost.
pub fn exit_status(code: i32) -> i32 {
    status_after(code, STDOUT_FAILED.get().or(STDERR_FAILED.get()))
}

/// [`exit_status`] given the first lost write, if any.
fn status_after(code: i32, lost: Option<&Failure>) -> i32 {
    match (code, lost) {
        (0, Some(Failure::ReaderGone)) => READER_GONE_EXIT,
        (0, Some(Failure::Other(_))) => 1,
        (code, _) => code,
    }
}

/// Prints `args` as they are on stdout (a table that ends with its newline).
pub fn print(args: fmt::Arguments<'_>) {
    emit(&STDOUT_FAILED, "stdout", || write_text(&mut io::stdout().lock(), args));
}

/// Prints a line on stdout.
pub fn line(args: fmt::Arguments<'_>) {
    print(format_args!("{args}\n"));
}

/// Prints a line on stderr.
pub fn error_line(args: fmt::Arguments<'_>) {
    emit(&STDERR_FAILED, "stderr", || write_line(&mut io::stderr().lock(), args));
}
/// `println!` that never panics (see the module).
macro_rules! outln {
    ($($arg:tt)*) => { $crate::out::line(format_args!($($arg)*)) };
}

/// `eprintln!` that never panics (see the module).
macro_rules! errln {
    ($($arg:tt)*) => { $crate::out::error_line(format_args!($($arg)*)) };
}

pub(crate) use {errln, outln};

/// Prints an operation's events as they happen: steps on stdout, warnings on stderr.
pub struct Printer;

impl Progress for Printer {
    fn report(&mut self, event: Event) {
        if event.is_notice() {
            errln!("{event}");
        } else {
            outln!("{event}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer whose reader has gone, or that fails otherwise.
    struct Broken(io::ErrorKind);

    impl Write for Broken {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Err(io::Error::from(self.0))
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_closed_pipe_is_told_apart_from_other_failures_and_never_panics() {
        let mut ok = Vec::new();
        assert_eq!(write_line(&mut ok, format_args!("sk1: {}", "started")), Ok(()));
        assert_eq!(write_text(&mut ok, format_args!("a table\n")), Ok(()));
        assert_eq!(String::from_utf8(ok).unwrap(), "sk1: started\na table\n");
        let gone = write_line(&mut Broken(io::ErrorKind::BrokenPipe), format_args!("lost"));
        assert_eq!(gone, Err(Failure::ReaderGone));
        let full = write_line(&mut Broken(io::ErrorKind::StorageFull), format_args!("lost"));
        assert!(matches!(full, Err(Failure::Other(_))), "{full:?}");
    }

    #[test]
    fn lost_output_changes_only_a_successful_commands_status() {
        assert_eq!(READER_GONE_EXIT, 141);
        assert_eq!(status_after(0, None), 0);
        assert_eq!(status_after(0, Some(&Failure::ReaderGone)), 141);
        assert_eq!(status_after(0, Some(&Failure::Other("disk full".into()))), 1);
        assert_eq!(status_after(2, Some(&Failure::ReaderGone)), 2, "a usage error says so");
        assert_eq!(status_after(1, None), 1);
    }

    #[test]
    fn a_real_closed_pipe_reports_the_reader_gone() {
        // Rust ignores SIGPIPE, so the write itself fails with EPIPE.
        let mut fds = [0; 2];
        // SAFETY: pipe(2) fills the two descriptors it is given.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: the read end is ours and closed once; the write end becomes the File's.
        let mut writer = unsafe {
            libc::close(fds[0]);
            <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fds[1])
        };
        assert_eq!(write_line(&mut writer, format_args!("sk1: started")), Err(Failure::ReaderGone));
    }
}
