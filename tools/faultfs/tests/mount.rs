//! Runs the `strata-faultfs` binary on temporary directories: the passthrough
//! serves real file operations from the backing directory, armed faults fail
//! fsync with EIO and writes with ENOSPC, and SIGTERM unmounts and exits 0.
//!
//! Needs /dev/fuse (and root, or fusermount3): without it these tests fail.

use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// A running `strata-faultfs` on `<tmp>/backing`, mounted at `<tmp>/mount`,
/// controlled by `<tmp>/control`. Dropping it stops the daemon, removes any
/// mount left behind (`fusermount3 -u -z`) and the temporary directory.
struct Daemon {
    child: Option<Child>,
    dir: PathBuf,
    backing: PathBuf,
    mount: PathBuf,
    control: PathBuf,
    stderr: Arc<Mutex<String>>,
}

/// Whether `mount` is a mount point (field 5 of /proc/self/mountinfo).
fn is_mounted(mount: &Path) -> bool {
    let info = fs::read_to_string("/proc/self/mountinfo").expect("reading /proc/self/mountinfo");
    info.lines().any(|line| line.split(' ').nth(4).map(Path::new) == Some(mount))
}

fn force_unmount(mount: &Path) {
    if is_mounted(mount) {
        let _ = Command::new("fusermount3").arg("-u").arg("-z").arg(mount).status();
    }
}

impl Daemon {
    fn start(name: &str) -> Daemon {
        assert!(
            Path::new("/dev/fuse").exists(),
            "/dev/fuse is missing: strata-faultfs tests need the FUSE device (load the fuse module; \
             in a container, pass --device /dev/fuse and CAP_SYS_ADMIN)"
        );
        let dir = std::env::temp_dir().join(format!("strata-faultfs-{name}-{}", std::process::id()));
        force_unmount(&dir.join("mount"));
        let _ = fs::remove_dir_all(&dir);
        let (backing, mount) = (dir.join("backing"), dir.join("mount"));
        fs::create_dir_all(&backing).unwrap();
        fs::create_dir_all(&mount).unwrap();
        let dir = dir.canonicalize().unwrap();
        let (backing, mount, control) = (dir.join("backing"), dir.join("mount"), dir.join("control"));

        let mut child = Command::new(strata_test_support::paths::bin_exe("strata-faultfs"))
            .arg("--backing")
            .arg(&backing)
            .arg("--mount")
            .arg(&mount)
            .arg("--control")
            .arg(&control)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting strata-faultfs");

        // Keep the daemon's log for assertions, and echo it into the test's output.
        let stderr = Arc::new(Mutex::new(String::new()));
        let mut err_pipe = BufReader::new(child.stderr.take().unwrap());
        let log = stderr.clone();
        std::thread::spawn(move || {
            let mut line = String::new();
            while err_pipe.read_line(&mut line).unwrap_or(0) > 0 {
                eprint!("{line}");
                log.lock().unwrap().push_str(&line);
                line.clear();
            }
        });
        let (tx, rx) = mpsc::channel();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });

        let daemon = Daemon { child: Some(child), dir, backing, mount, control, stderr };
        match rx.recv_timeout(Duration::from_secs(10)) {
            Ok(line) if line == format!("mounted {}", daemon.mount.display()) => {}
            Ok(line) => panic!("unexpected output from strata-faultfs: {line}"),
            Err(e) => panic!("strata-faultfs did not mount ({e}); its log:\n{}", daemon.log()),
        }
        assert!(is_mounted(&daemon.mount), "mounted is printed but {} is not a mount point", daemon.mount.display());
        daemon
    }

    fn log(&self) -> String {
        // Give the reader thread a moment to catch up with the last lines.
        std::thread::sleep(Duration::from_millis(50));
        self.stderr.lock().unwrap().clone()
    }

    fn m(&self, rel: &str) -> PathBuf {
        self.mount.join(rel)
    }

    fn b(&self, rel: &str) -> PathBuf {
        self.backing.join(rel)
    }

    fn set_faults(&self, tokens: &str) {
        fs::write(&self.control, tokens).unwrap();
    }

    /// Sends SIGTERM and waits (bounded) for the exit status.
    fn stop(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("daemon already stopped");
        // SAFETY: plain kill(2) of our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        wait_bounded(&mut child, Duration::from_secs(10)).unwrap_or_else(|| {
            let _ = child.kill();
            let _ = child.wait();
            panic!("strata-faultfs did not exit within 10 s of SIGTERM; its log:\n{}", self.log())
        })
    }
}

fn wait_bounded(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait().ok().flatten() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: plain kill(2) of our own child.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            if wait_bounded(&mut child, Duration::from_secs(5)).is_none() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        force_unmount(&self.mount);
        if !is_mounted(&self.mount) {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

fn errno(result: io::Result<impl std::fmt::Debug>) -> i32 {
    match result {
        Ok(v) => panic!("expected an error, got Ok({v:?})"),
        Err(e) => e.raw_os_error().unwrap_or_else(|| panic!("error without errno: {e}")),
    }
}

/// Every name readdir returns, `.` and `..` included (std::fs::read_dir hides them).
fn raw_names(dir: &Path) -> Vec<String> {
    let c = CString::new(dir.as_os_str().as_bytes()).unwrap();
    let mut names = Vec::new();
    // SAFETY: opendir/readdir/closedir on a valid path; each entry's name is
    // a NUL-terminated string valid until the next readdir.
    unsafe {
        let d = libc::opendir(c.as_ptr());
        assert!(!d.is_null(), "opendir {}: {}", dir.display(), io::Error::last_os_error());
        loop {
            let entry = libc::readdir(d);
            if entry.is_null() {
                break;
            }
            let name = std::ffi::CStr::from_ptr((*entry).d_name.as_ptr());
            names.push(name.to_string_lossy().into_owned());
        }
        libc::closedir(d);
    }
    names.sort();
    names
}

/// The services' directory sync, as an `io::Result` for `errno`.
fn sync_dir(dir: &Path) -> io::Result<()> {
    strata_service::durable::sync_dir(dir).map_err(|e| e.source)
}

/// Bytes that differ at every position, so a misplaced chunk shows.
fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
}

#[test]
fn passthrough_and_injected_faults() {
    let mut d = Daemon::start("main");

    // Create, write and read through the mount; the bytes land in the backing directory.
    fs::write(d.m("a"), b"hello").unwrap();
    assert_eq!(fs::read(d.m("a")).unwrap(), b"hello");
    assert_eq!(fs::read(d.b("a")).unwrap(), b"hello");
    // Files made in the backing directory show through the mount.
    fs::write(d.b("from-backing"), b"direct").unwrap();
    assert_eq!(fs::read(d.m("from-backing")).unwrap(), b"direct");

    // A large file in many FUSE requests, then positional I/O within it.
    let big = pattern(3 * 1024 * 1024 + 123);
    fs::write(d.m("big"), &big).unwrap();
    assert_eq!(fs::read(d.b("big")).unwrap(), big);
    assert_eq!(fs::read(d.m("big")).unwrap(), big);
    let f = OpenOptions::new().read(true).write(true).open(d.m("big")).unwrap();
    f.write_all_at(b"XYZ", 1_000_000).unwrap();
    let mut buf = [0; 5];
    f.read_exact_at(&mut buf, 999_999).unwrap();
    assert_eq!(&buf, &[big[999_999], b'X', b'Y', b'Z', big[1_000_003]]);
    f.sync_all().unwrap();
    f.sync_data().unwrap();
    drop(f);

    // Directories: mkdir, listing with dot entries, and O_APPEND and O_EXCL opens.
    fs::create_dir_all(d.m("dir/sub")).unwrap();
    fs::write(d.m("dir/sub/f"), b"in sub").unwrap();
    assert_eq!(raw_names(&d.m("dir")), [".", "..", "sub"]);
    assert_eq!(raw_names(&d.mount), [".", "..", "a", "big", "dir", "from-backing"]);
    let mut log = OpenOptions::new().append(true).open(d.m("dir/sub/f")).unwrap();
    log.write_all(b" appended").unwrap();
    drop(log);
    assert_eq!(fs::read(d.b("dir/sub/f")).unwrap(), b"in sub appended");
    assert_eq!(errno(OpenOptions::new().write(true).create_new(true).open(d.m("a"))), libc::EEXIST);
    assert_eq!(errno(fs::read(d.m("missing"))), libc::ENOENT);

    // Atomic replacement: write a temporary file, fsync, rename over the target, fsync the directory.
    let mut tmp = File::create(d.m("a.tmp")).unwrap();
    tmp.write_all(b"replaced").unwrap();
    tmp.sync_all().unwrap();
    drop(tmp);
    fs::rename(d.m("a.tmp"), d.m("a")).unwrap();
    sync_dir(&d.mount).unwrap();
    assert_eq!(fs::read(d.m("a")).unwrap(), b"replaced");
    assert_eq!(fs::read(d.b("a")).unwrap(), b"replaced");
    assert!(!d.m("a.tmp").exists() && !d.b("a.tmp").exists());

    // Renaming a directory moves its children; a file open across the rename stays usable.
    let open_child = OpenOptions::new().read(true).write(true).open(d.m("dir/sub/f")).unwrap();
    fs::rename(d.m("dir"), d.m("moved")).unwrap();
    assert_eq!(fs::read(d.m("moved/sub/f")).unwrap(), b"in sub appended");
    assert!(!d.m("dir").exists() && !d.b("dir").exists());
    open_child.write_all_at(b"IN", 0).unwrap();
    open_child.sync_data().unwrap();
    assert_eq!(fs::read(d.b("moved/sub/f")).unwrap(), b"IN sub appended");
    drop(open_child);
    sync_dir(&d.m("moved/sub")).unwrap();

    // Attributes: size, mode, owner, times.
    let f = OpenOptions::new().write(true).open(d.m("moved/sub/f")).unwrap();
    f.set_len(2).unwrap();
    f.set_permissions(fs::Permissions::from_mode(0o640)).unwrap();
    let mtime = SystemTime::UNIX_EPOCH + Duration::from_secs(1_600_000_000);
    f.set_modified(mtime).unwrap();
    drop(f);
    let meta = fs::metadata(d.b("moved/sub/f")).unwrap();
    assert_eq!((meta.len(), meta.mode() & 0o7777), (2, 0o640));
    assert_eq!(meta.modified().unwrap(), mtime);
    assert_eq!(fs::metadata(d.m("moved/sub/f")).unwrap().modified().unwrap(), mtime);
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        std::os::unix::fs::chown(d.m("moved/sub/f"), Some(1234), Some(4321)).unwrap();
        let meta = fs::metadata(d.b("moved/sub/f")).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (1234, 4321));
    }

    // Unlink (an open file keeps working), rmdir, statfs, access.
    let mut doomed = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(d.m("doomed")).unwrap();
    fs::remove_file(d.m("doomed")).unwrap();
    assert!(!d.b("doomed").exists());
    doomed.write_all(b"still here").unwrap();
    assert_eq!(doomed.metadata().unwrap().len(), 10);
    let mut back = [0; 10];
    doomed.read_exact_at(&mut back, 0).unwrap();
    assert_eq!(&back, b"still here");
    drop(doomed);
    fs::remove_file(d.m("moved/sub/f")).unwrap();
    fs::remove_dir(d.m("moved/sub")).unwrap();
    assert!(!d.b("moved/sub").exists());
    assert_eq!(errno(fs::remove_dir(d.m("moved/nothing"))), libc::ENOENT);
    let (mut vm, mut vb) = unsafe { (std::mem::zeroed::<libc::statvfs>(), std::mem::zeroed::<libc::statvfs>()) };
    let (cm, cb) = (
        CString::new(d.mount.as_os_str().as_bytes()).unwrap(),
        CString::new(d.backing.as_os_str().as_bytes()).unwrap(),
    );
    // SAFETY: valid strings and out pointers.
    unsafe {
        assert_eq!(libc::statvfs(cm.as_ptr(), &mut vm), 0);
        assert_eq!(libc::statvfs(cb.as_ptr(), &mut vb), 0);
    }
    assert!(vm.f_blocks > 0);
    assert_eq!((vm.f_blocks, vm.f_bsize), (vb.f_blocks, vb.f_bsize));

    // fsync faults: every fsync, fdatasync and directory fsync fails with EIO; reads and writes go on.
    let f = OpenOptions::new().read(true).write(true).open(d.m("a")).unwrap();
    d.set_faults("fsync\n");
    assert_eq!(errno(f.sync_all()), libc::EIO);
    assert_eq!(errno(f.sync_data()), libc::EIO);
    assert_eq!(errno(sync_dir(&d.mount)), libc::EIO);
    assert_eq!(errno(sync_dir(&d.m("moved"))), libc::EIO);
    assert_eq!(fs::read(d.m("a")).unwrap(), b"replaced");
    f.write_all_at(b"R", 0).unwrap();
    assert_eq!(fs::read(d.b("a")).unwrap(), b"Replaced");
    // A write that must be durable on return (O_DSYNC) is an fsync too.
    let dsync = OpenOptions::new().write(true).custom_flags(libc::O_DSYNC).open(d.m("a")).unwrap();
    assert_eq!(errno(dsync.write_at(b"x", 0)), libc::EIO);
    drop(dsync);
    // Failures are not remembered: with the faults cleared, fsync works again.
    d.set_faults("");
    f.sync_all().unwrap();
    f.sync_data().unwrap();
    sync_dir(&d.mount).unwrap();

    // Write faults: writes fail with ENOSPC; reads and fsync still work.
    d.set_faults("write");
    assert_eq!(errno(f.write_at(b"no", 0)), libc::ENOSPC);
    assert_eq!(errno(fs::write(d.m("new-file"), b"data")), libc::ENOSPC);
    assert_eq!(fs::read(d.m("a")).unwrap(), b"Replaced");
    f.sync_all().unwrap();
    // An absent control file means no faults.
    fs::remove_file(&d.control).unwrap();
    f.write_all_at(b"ok", 0).unwrap();
    assert_eq!(fs::read(d.b("a")).unwrap(), b"okplaced");
    drop(f);

    let log = d.log();
    for line in [
        "injected EIO into fsync of a ",
        "injected EIO into fdatasync of a ",
        "injected EIO into directory fsync of / ",
        "injected EIO into directory fsync of moved ",
        "injected EIO into synchronous write of a ",
        "injected ENOSPC into write of a ",
        "injected ENOSPC into write of new-file ",
    ] {
        assert!(log.contains(line), "log lacks {line:?}:\n{log}");
    }

    let status = d.stop();
    assert!(status.success(), "strata-faultfs exited with {status}; its log:\n{}", d.log());
    assert!(!is_mounted(&d.mount), "{} is still mounted after SIGTERM", d.mount.display());
    assert!(d.log().contains("(7 failures injected)"), "{}", d.log());
}

#[test]
fn sigterm_while_a_file_is_open_still_unmounts() {
    let mut d = Daemon::start("busy");
    let held = File::create(d.m("held")).unwrap();
    let status = d.stop();
    assert!(status.success(), "strata-faultfs exited with {status}; its log:\n{}", d.log());
    assert!(!is_mounted(&d.mount), "{} is still mounted after SIGTERM", d.mount.display());
    drop(held);
}
