//! `strata-faultfs`: a FUSE passthrough of a backing directory that fails
//! fsync (EIO) or writes (ENOSPC) while a control file says so, for tests
//! that check services fail-stop on storage faults.
//!
//! Runs in the foreground; prints `mounted <mount>` once the mount serves
//! requests; on SIGTERM or SIGINT unmounts and exits 0.

mod faults;
mod hooks;
mod limits;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use fuser::{Config, MountOption, Session, SessionACL};

use strata_fusefs::{sys, Passthrough};

use crate::faults::{log, Faults};
use crate::hooks::FaultHooks;

/// Command line.
#[derive(Parser, Debug)]
#[command(name = "strata-faultfs", about = "FUSE passthrough file system that fails fsync or writes on demand")]
struct Args {
    /// Directory whose contents the mount shows.
    #[arg(long)]
    backing: PathBuf,
    /// Empty directory to mount on.
    #[arg(long)]
    mount: PathBuf,
    /// Control file, outside the mount: whitespace-separated tokens `fsync`
    /// (fsyncs fail with EIO) and `write` (writes fail with ENOSPC); absent or
    /// empty means no faults. Read before every operation that can fail.
    #[arg(long)]
    control: PathBuf,
}

/// Absolute paths checked to be usable together.
struct Paths {
    backing: PathBuf,
    mount: PathBuf,
    control: PathBuf,
}

/// Resolves the three paths and refuses layouts that would make the daemon
/// call into its own mount (which deadlocks it): a mount inside the backing
/// directory, or a control file inside the mount.
fn check_paths(args: &Args) -> Result<Paths, String> {
    let dir = |p: &Path, what: &str| -> Result<PathBuf, String> {
        let canonical = p.canonicalize().map_err(|e| format!("{what} {}: {e}", p.display()))?;
        if !canonical.is_dir() {
            return Err(format!("{what} {} is not a directory", p.display()));
        }
        Ok(canonical)
    };
    let backing = dir(&args.backing, "backing directory")?;
    let mount = dir(&args.mount, "mount point")?;
    if mount.starts_with(&backing) {
        return Err(format!("mount point {} is inside the backing directory {}", mount.display(), backing.display()));
    }
    let name =
        args.control.file_name().ok_or_else(|| format!("control file {} has no name", args.control.display()))?;
    let parent = match args.control.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let control = dir(parent, "control file's directory")?.join(name);
    if control.starts_with(&mount) {
        return Err(format!("control file {} is inside the mount point", control.display()));
    }
    Ok(Paths { backing, mount, control })
}

fn run(args: Args) -> Result<(), String> {
    // Before any thread starts, so that every thread inherits the mask.
    let signals = sys::StopSignals::block().map_err(|e| format!("blocking signals: {e}"))?;
    let paths = check_paths(&args)?;
    // Modes from callers are applied exactly (the kernel or the caller's
    // umask already masked them), not masked again by ours.
    sys::set_umask(0);

    let faults = Arc::new(Faults::new(paths.control.clone()));
    let fs = Passthrough::new(paths.backing.clone(), FaultHooks(faults.clone()));
    let mut config = Config::default();
    config.mount_options = vec![MountOption::FSName("strata-faultfs".into())];
    if sys::effective_ids().0 == 0 {
        // As root, serve every user (a service may run as another one) and
        // let the kernel check permissions against the backing modes.
        config.acl = SessionACL::All;
        config.mount_options.push(MountOption::DefaultPermissions);
    }
    let session =
        Session::new(fs, &paths.mount, &config).map_err(|e| format!("mounting {}: {e}", args.mount.display()))?;
    let background = session.spawn().map_err(|e| format!("starting the FUSE session: {e}"))?;
    // Tests wait for this line. A closed stdout is no reason to stop serving.
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "mounted {}", args.mount.display()).and_then(|()| stdout.flush());
    drop(stdout);
    log(format_args!(
        "serving {} on {}, control file {}",
        paths.backing.display(),
        paths.mount.display(),
        paths.control.display()
    ));

    loop {
        if let Some(sig) = signals.wait(limits::SIGNAL_POLL) {
            log(format_args!("signal {sig}: unmounting {}", paths.mount.display()));
            break;
        }
        if background.guard.is_finished() {
            // Unmounted from outside (fusermount3 -u, umount): nothing left to serve.
            let result = background.join();
            return Err(format!("the mount at {} ended without a signal: {result:?}", paths.mount.display()));
        }
    }
    if let Err(e) = background.umount_and_join() {
        // Busy (a process still has files open there): detach it now; the
        // kernel drops it when its last user goes, and our exit ends the
        // session for anything still open.
        log(format_args!("unmount: {e}; detaching lazily"));
        match sys::detach(&paths.mount) {
            Ok(()) => {}
            // EINVAL: no longer a mount point, which is what we wanted.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
            Err(e) => return Err(format!("detaching {}: {e}", paths.mount.display())),
        }
    }
    log(format_args!("unmounted {} ({} failures injected)", paths.mount.display(), faults.injected()));
    Ok(())
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            log(format_args!("error: {e}"));
            ExitCode::FAILURE
        }
    }
}
