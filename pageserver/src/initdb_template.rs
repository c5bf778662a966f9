//! The kept output of `initdb` that new tenants are imported from.
//!
//! `initdb` takes well over a second and gives the same catalog every time
//! for one PostgreSQL install and one set of options; only the system
//! identifier and the mock authentication nonce of `pg_control` are chosen
//! per cluster. So the pageserver runs `initdb` once per install, keeps the
//! data directory, and gives each new tenant an identity of its own at
//! import ([`crate::import::fresh_identity`]). The template is found again by a descriptor
//! of the install (paths, sizes and modification times of `initdb` and
//! `postgres`, and the options): an upgraded PostgreSQL makes a new one.
//!
//! Several pageservers of one machine may share a template directory: a
//! template is built in a directory of its own and renamed into place, so a
//! reader sees a complete one or none, and a loser of that race uses the
//! winner's.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::SystemTime;

use parking_lot::Mutex;
use strata_formats::PgVersion;
use tracing::{info, warn};

use crate::config::PageserverConfig;
use crate::import::ImportError;
use crate::limits::{INITDB_TEMPLATES_KEPT, INITDB_TEMPLATE_TMP_AGE};
use crate::user;

/// The options every tenant's `initdb` runs with; part of the descriptor.
pub const INITDB_OPTIONS: [&str; 6] =
    ["-U", "postgres", "--encoding=UTF8", "--locale=C", "--no-instructions", "--no-sync"];

/// Name of the file in a template that says which install made it.
const DESCRIPTOR: &str = "descriptor";
/// The data directory inside a template.
const PGDATA: &str = "pgdata";

/// Finds or makes the template of one pageserver's PostgreSQL install.
pub struct InitdbTemplates {
    root: PathBuf,
    /// One build at a time in this process (others wait and reuse it).
    building: Mutex<()>,
}

impl InitdbTemplates {
    /// Templates under `root` (created when first needed).
    pub fn new(root: PathBuf) -> InitdbTemplates {
        InitdbTemplates { root, building: Mutex::new(()) }
    }

    /// Where the templates live.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The data directory of the template for `conf`'s install of
    /// PostgreSQL `version`, built first if there is none yet.
    /// `now` is the wall-clock time (the age of abandoned builds).
    pub fn pgdata(&self, conf: &PageserverConfig, version: PgVersion, now: SystemTime) -> Result<PathBuf, ImportError> {
        let bin_dir = conf.bin_dir(version);
        let descriptor = describe(&bin_dir)?;
        let dir = self.root.join(format!("{}{:08x}", family(version), crc32c::crc32c(descriptor.as_bytes())));
        if matches_descriptor(&dir, &descriptor) {
            return Ok(dir.join(PGDATA));
        }
        let _one = self.building.lock();
        if matches_descriptor(&dir, &descriptor) {
            return Ok(dir.join(PGDATA));
        }
        self.build(conf, &bin_dir, &dir, &descriptor)?;
        self.prune(&dir, version, now);
        Ok(dir.join(PGDATA))
    }

    /// Runs `initdb` in a directory of its own and renames it to `dir`.
    fn build(&self, conf: &PageserverConfig, bin_dir: &Path, dir: &Path, descriptor: &str) -> Result<(), ImportError> {
        create_root(&self.root)?;
        let tmp = self.root.join(format!("tmp-{}-{:016x}", std::process::id(), random_u64()));
        let result = (|| {
            std::fs::create_dir(&tmp).map_err(|e| io(&tmp, e))?;
            traversable(&tmp)?;
            run_initdb(conf, bin_dir, &tmp.join(PGDATA))?;
            if conf.fsync {
                // Once renamed, the template is trusted as it is: its files
                // must be on disk first.
                sync_tree(&tmp)?;
            }
            let path = tmp.join(DESCRIPTOR);
            std::fs::write(&path, descriptor).map_err(|e| io(&path, e))?;
            if std::fs::rename(&tmp, dir).is_ok() || matches_descriptor(dir, descriptor) {
                // Ours, or that of another pageserver sharing the directory
                // that won the race: either is whole.
                return Ok(());
            }
            // Something else under that name (another descriptor whose
            // checksum collides, a directory left by hand): replaced.
            std::fs::remove_dir_all(dir).map_err(|e| io(dir, e))?;
            std::fs::rename(&tmp, dir).map_err(|e| io(dir, e))
        })();
        if tmp.exists() {
            let _ = std::fs::remove_dir_all(&tmp);
        }
        if result.is_ok() {
            info!(template = %dir.display(), "kept an initdb template for new tenants");
        }
        result
    }

    /// Keeps the newest templates of `version` (older installs of the same
    /// major go; other majors' are left alone) and removes unfinished
    /// builds old enough that no live build owns them.
    fn prune(&self, keep: &Path, version: PgVersion, now: SystemTime) {
        let family = family(version);
        let Ok(entries) = std::fs::read_dir(&self.root) else { return };
        let mut templates = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            let modified = entry.metadata().and_then(|m| m.modified()).ok();
            if name.starts_with("tmp-") {
                let old =
                    modified.and_then(|m| now.duration_since(m).ok()).is_some_and(|age| age > INITDB_TEMPLATE_TMP_AGE);
                if old {
                    remove(&path);
                }
            } else if (name.starts_with(&family) || name.starts_with(LEGACY_FAMILY)) && path != keep {
                templates.push((modified, path));
            }
        }
        templates.sort();
        let excess = (templates.len() + 1).saturating_sub(INITDB_TEMPLATES_KEPT);
        for (_, path) in templates.into_iter().take(excess) {
            remove(&path);
        }
    }
}

/// The name prefix of one major's templates (`pg15-`, `pg18-`): a
/// directory shared by pageservers of several majors keeps each one's.
fn family(version: PgVersion) -> String {
    format!("pg{}-", version.major())
}

/// The prefix templates had before they were named by major (pruned with
/// any major's).
const LEGACY_FAMILY: &str = "pg-";

/// Runs `initdb` of `bin_dir` into `dir` as the configured unprivileged
/// user when running as root.
fn run_initdb(conf: &PageserverConfig, bin_dir: &Path, dir: &Path) -> Result<(), ImportError> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(|e| io(dir, e))?;
    }
    std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
    let initdb = bin_dir.join("initdb");
    let mut cmd = Command::new(&initdb);
    cmd.arg("-D").arg(dir).args(INITDB_OPTIONS);
    user::run_as(&mut cmd, dir, &conf.pg_user)?;
    let out = cmd.output().map_err(|source| ImportError::Spawn { program: initdb.clone(), source })?;
    if !out.status.success() {
        return Err(ImportError::Initdb {
            program: initdb,
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(())
}

/// What makes one template differ from another: the programs that write it
/// (path, size, modification time) and the options.
fn describe(bin_dir: &Path) -> Result<String, ImportError> {
    let mut out = String::from("strata initdb template 1\n");
    for program in ["initdb", "postgres"] {
        let path = bin_dir.join(program);
        let meta = std::fs::metadata(&path).map_err(|e| io(&path, e))?;
        let mtime = meta.modified().ok().and_then(|m| m.duration_since(std::time::UNIX_EPOCH).ok());
        let mtime = mtime.map(|d| d.as_nanos()).unwrap_or(0);
        out.push_str(&format!("{} {} {mtime}\n", path.display(), meta.len()));
    }
    out.push_str(&INITDB_OPTIONS.join(" "));
    out.push('\n');
    Ok(out)
}

fn matches_descriptor(dir: &Path, descriptor: &str) -> bool {
    std::fs::read_to_string(dir.join(DESCRIPTOR)).is_ok_and(|d| d == descriptor)
}

fn create_root(root: &Path) -> Result<(), ImportError> {
    if root.is_dir() {
        return Ok(());
    }
    std::fs::DirBuilder::new().recursive(true).create(root).map_err(|e| io(root, e))?;
    traversable(root)
}

/// Makes `dir` traversable by all, listable by its owner only: initdb runs
/// as the PostgreSQL user inside. Set after creation, since the service's
/// umask (`strata_service::start::private_umask`) takes the bits off any
/// mode asked for at creation.
fn traversable(dir: &Path) -> Result<(), ImportError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711)).map_err(|e| io(dir, e))
}

/// fsyncs every file and directory under `dir`.
fn sync_tree(dir: &Path) -> Result<(), ImportError> {
    for entry in std::fs::read_dir(dir).map_err(|e| io(dir, e))? {
        let path = entry.map_err(|e| io(dir, e))?.path();
        if path.is_dir() {
            sync_tree(&path)?;
        } else {
            std::fs::File::open(&path).and_then(|f| f.sync_all()).map_err(|e| io(&path, e))?;
        }
    }
    std::fs::File::open(dir).and_then(|f| f.sync_all()).map_err(|e| io(dir, e))
}

fn remove(path: &Path) {
    if let Err(e) = std::fs::remove_dir_all(path) {
        warn!(path = %path.display(), "removing an old initdb template: {e}");
    }
}

fn io(path: &Path, e: std::io::Error) -> ImportError {
    ImportError::Storage(crate::timeline::StorageError::Io { op: "preparing", path: path.to_path_buf(), source: e })
}

fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    getrandom::fill(&mut b).expect("the OS random source works");
    u64::from_le_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::import::fresh_identity;

    #[test]
    fn a_fresh_identity_changes_the_system_identifier_and_nonce_and_keeps_the_rest() {
        let bytes =
            std::fs::read(strata_test_support::paths::in_crate("../formats/tests/data/pg_control_v15")).unwrap();
        let template = strata_formats::v15::control::ControlFile::decode(&bytes).unwrap();
        let mut a = template.clone();
        let mut b = template.clone();
        fresh_identity(&mut a, 1_800_000_000);
        fresh_identity(&mut b, 1_800_000_000);
        assert_ne!(a.system_identifier, b.system_identifier);
        assert_eq!(a.system_identifier >> 32, 1_800_000_000);
        assert_ne!(a.mock_authentication_nonce(), b.mock_authentication_nonce());
        assert_ne!(a.mock_authentication_nonce(), template.mock_authentication_nonce());
        // What PostgreSQL reads back: a valid file, equal apart from the identity.
        let decoded = strata_formats::v15::control::ControlFile::decode(&a.encode()).unwrap();
        assert_eq!(decoded.encode(), a.encode());
        assert_eq!(decoded.system_identifier, a.system_identifier);
        assert_eq!(decoded.mock_authentication_nonce(), a.mock_authentication_nonce());
        let mut same = decoded.clone();
        same.system_identifier = template.system_identifier;
        same.set_mock_authentication_nonce(template.mock_authentication_nonce());
        assert_eq!(same.encode(), template.encode());
    }

    #[test]
    fn old_templates_and_abandoned_builds_are_pruned_and_the_newest_kept() {
        let root = tempdir();
        let templates = InitdbTemplates::new(root.clone());
        let now = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_800_000_000);
        let at = |path: &Path, secs_before: u64| {
            let t = now - std::time::Duration::from_secs(secs_before);
            std::fs::File::open(path).unwrap().set_modified(t).unwrap();
        };
        let made = INITDB_TEMPLATES_KEPT + 2;
        for i in 0..made {
            let dir = root.join(format!("pg15-{i:08x}"));
            std::fs::create_dir_all(dir.join(PGDATA)).unwrap();
            // Oldest first.
            at(&dir, 1000 - i as u64);
        }
        // Another major's template, older than all: not 15's to prune.
        let other = root.join("pg18-00000000");
        std::fs::create_dir_all(other.join(PGDATA)).unwrap();
        at(&other, 5000);
        // A template named before names carried the major: pruned as 15's
        // oldest.
        let legacy = root.join("pg-00000000");
        std::fs::create_dir_all(legacy.join(PGDATA)).unwrap();
        at(&legacy, 4000);
        let young_tmp = root.join("tmp-1-0");
        let old_tmp = root.join("tmp-2-0");
        std::fs::create_dir(&young_tmp).unwrap();
        std::fs::create_dir(&old_tmp).unwrap();
        at(&young_tmp, 1);
        at(&old_tmp, INITDB_TEMPLATE_TMP_AGE.as_secs() + 1);
        // The oldest is the one in use: it stays whatever its age.
        templates.prune(&root.join("pg15-00000000"), PgVersion::V15, now);
        let mut left: Vec<String> =
            std::fs::read_dir(&root).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        left.sort();
        let mut want = vec!["pg15-00000000".to_string(), "pg18-00000000".to_string(), "tmp-1-0".to_string()];
        want.extend((made - (INITDB_TEMPLATES_KEPT - 1)..made).map(|i| format!("pg15-{i:08x}")));
        want.sort();
        assert_eq!(left, want);
        std::fs::remove_dir_all(&root).unwrap();
    }

    /// A config whose `initdb` is a script that makes a data directory of
    /// one file, slowly enough for builds to overlap.
    fn fake_install(dir: &Path) -> PageserverConfig {
        use std::os::unix::fs::PermissionsExt;
        let bin = dir.join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        let initdb = bin.join("initdb");
        std::fs::write(&initdb, "#!/bin/sh\nsleep 0.2\nmkdir -p \"$2/global\" && echo made > \"$2/global/marker\"\n")
            .unwrap();
        std::fs::set_permissions(&initdb, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(bin.join("postgres"), "a postgres").unwrap();
        toml::from_str(&format!(
            "id = 1\nlisten_pg = \"127.0.0.1:1\"\nlisten_http = \"127.0.0.1:2\"\ndata_dir = {:?}\n\
             pg_bin_dir = {:?}\nfsync = false\n",
            dir.join("data").display().to_string(),
            bin.display().to_string()
        ))
        .unwrap()
    }

    #[test]
    fn another_install_has_another_descriptor() {
        let dir = tempdir();
        let conf = fake_install(&dir);
        let before = describe(&conf.pg_bin_dir).unwrap();
        assert_eq!(describe(&conf.pg_bin_dir).unwrap(), before);
        std::fs::write(conf.pg_bin_dir.join("postgres"), "an upgraded postgres").unwrap();
        assert_ne!(describe(&conf.pg_bin_dir).unwrap(), before);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn pageservers_sharing_a_directory_build_one_template_and_leave_no_build_behind() {
        let dir = tempdir();
        let conf = fake_install(&dir);
        let root = dir.join("templates");
        // Real time: the builds' directories are as old as they really are.
        let now = strata_service::clock::Clock::system_now(&strata_service::clock::SystemClock);
        let made: Vec<PathBuf> = std::thread::scope(|s| {
            let builds: Vec<_> = (0..3)
                .map(|_| s.spawn(|| InitdbTemplates::new(root.clone()).pgdata(&conf, PgVersion::V15, now).unwrap()))
                .collect();
            builds.into_iter().map(|b| b.join().unwrap()).collect()
        });
        assert!(made.iter().all(|p| p == &made[0]), "{made:?}");
        assert_eq!(std::fs::read_to_string(made[0].join("global/marker")).unwrap(), "made\n");
        let left: Vec<String> =
            std::fs::read_dir(&root).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        assert_eq!(left.len(), 1, "{left:?}");
        assert!(left[0].starts_with("pg15-"), "{left:?}");
        // initdb's user reaches the data directory whatever the umask; no
        // other user lists the directories on the way.
        for d in [root.clone(), root.join(&left[0])] {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(std::fs::metadata(&d).unwrap().permissions().mode() & 0o777, 0o711, "{}", d.display());
        }
        // Found again without running initdb.
        std::fs::remove_file(conf.pg_bin_dir.join("initdb")).unwrap();
        std::fs::write(conf.pg_bin_dir.join("initdb"), "").unwrap();
        let again = InitdbTemplates::new(root.clone()).pgdata(&conf, PgVersion::V15, now);
        // The install changed (initdb is another file now): a new build is
        // attempted, and fails, leaving the old template and nothing else.
        assert!(again.is_err());
        assert_eq!(std::fs::read_dir(&root).unwrap().count(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn tempdir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!("strata-initdb-template-test-{:016x}", random_u64()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}
