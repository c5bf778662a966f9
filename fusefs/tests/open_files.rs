//! The passthrough mounted for real with a bound on its open backing files:
//! many handles open at once cost a few descriptors, each still reads and
//! writes its own file, and a file unlinked or replaced while open (its
//! descriptor closed by the bound before) is still served through its
//! handles.
//!
//! Needs /dev/fuse (and root, or fusermount3).

use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::FileExt;

use strata_fusefs::testing::Mounted;
use strata_fusefs::{Hooks, Passthrough};

struct Plain;
impl Hooks for Plain {}

fn mount(name: &str, max_open: usize) -> Mounted {
    let dir = std::env::temp_dir().join(format!("strata-fusefs-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    let (backing, mnt) = (dir.join("backing"), dir.join("mnt"));
    fs::create_dir_all(&backing).unwrap();
    fs::create_dir_all(&mnt).unwrap();
    let fs = Passthrough::new(backing.canonicalize().unwrap(), Plain).max_open_files(max_open);
    let mut config = fuser::Config::default();
    config.n_threads = Some(2);
    let session = fuser::Session::new(fs, &mnt, &config).unwrap().spawn().unwrap();
    Mounted::new(dir, mnt, session)
}

fn open_descriptors() -> usize {
    fs::read_dir("/proc/self/fd").unwrap().count()
}

fn content(i: usize) -> Vec<u8> {
    format!("file {i} ").repeat(100 + i).into_bytes()
}

fn read_all(f: &File) -> Vec<u8> {
    let len = f.metadata().unwrap().len() as usize;
    let mut buf = vec![0u8; len];
    f.read_exact_at(&mut buf, 0).unwrap();
    buf
}

#[test]
fn many_open_handles_hold_few_descriptors_and_each_serves_its_own_file() {
    const FILES: usize = 60;
    let m = mount("bounded", 4);
    let before = open_descriptors();
    let files: Vec<File> = (0..FILES)
        .map(|i| {
            let mut options = OpenOptions::new();
            options.read(true).write(true).create(true).truncate(true);
            let f = options.open(m.mnt.join(format!("f{i}"))).unwrap();
            f.write_all_at(&content(i), 0).unwrap();
            f
        })
        .collect();
    // Our FILES descriptors, and only a few of the daemon's.
    let held = open_descriptors() - before;
    assert!(held < FILES + 16, "{held} descriptors for {FILES} open files");
    // Every handle, its descriptor closed long ago or not, reads, writes and
    // syncs its own file.
    for (i, f) in files.iter().enumerate() {
        assert_eq!(read_all(f), content(i), "file {i}");
        f.write_all_at(b"again", 0).unwrap();
        f.sync_all().unwrap();
    }
    for (i, f) in files.iter().enumerate().rev() {
        let mut head = [0u8; 5];
        f.read_exact_at(&mut head, 0).unwrap();
        assert_eq!(&head, b"again", "file {i}");
    }

    // Unlinked while open (its descriptor closed by the bound): still served.
    let mut expected = content(0);
    expected[..5].copy_from_slice(b"again");
    fs::remove_file(m.mnt.join("f0")).unwrap();
    assert!(!m.dir.join("backing/f0").exists());
    for f in &files[1..] {
        f.write_all_at(b"other", 0).unwrap(); // the hand goes round
    }
    assert_eq!(read_all(&files[0]), expected);
    files[0].write_all_at(b"still", 0).unwrap();
    let mut head = [0u8; 5];
    files[0].read_exact_at(&mut head, 0).unwrap();
    assert_eq!(&head, b"still");

    // Replaced by a rename while open: the handle keeps the old file.
    fs::rename(m.mnt.join("f2"), m.mnt.join("f1")).unwrap();
    for f in &files[3..] {
        f.write_all_at(b"round", 0).unwrap();
    }
    let old = read_all(&files[1]);
    assert_eq!(&old[..5], b"other");
    assert_eq!(&old[5..], &content(1)[5..]);
    // And the renamed file's handle follows it to its new name.
    assert_eq!(&read_all(&files[2])[5..], &content(2)[5..]);
    assert_eq!(fs::read(m.mnt.join("f1")).unwrap(), read_all(&files[2]));
}
