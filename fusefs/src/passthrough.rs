//! The passthrough file system: every request is served from the backing
//! directory, with [`Hooks`] called around the operations that users of
//! the crate change: reads, writes, syncs, truncation, creation, removal.
//!
//! Kernel caching is kept out of the way unless asked for. By default each
//! write(2) reaches this daemon before it returns, attribute and entry TTLs
//! are zero and open files start with an empty page cache, so a change made
//! directly in the backing directory is seen at once and a failed write is
//! a failure its caller sees. [`Passthrough::exclusive`] lets the kernel
//! cache attributes, names and pages when nothing else changes the backing
//! directory; [`Passthrough::writeback_cache`] lets it gather writes too,
//! a failed write-back then being reported by the next fsync (as a kernel
//! file system reports it).

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::{self, File, Metadata, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, DirEntryExt, FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fuser::{
    AccessFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};
use parking_lot::Mutex;
use tracing::warn;

use crate::inodes::Inodes;
use crate::open_files::{OpenFiles, Slot};
use crate::sys;

/// Our inode numbers are never reused, so generations are not needed.
const GENERATION: Generation = Generation(0);

/// An open file or directory of the backing directory.
struct Handle {
    /// The inode it was opened through (for attributes of unlinked files).
    ino: u64,
    kind: HandleKind,
}

enum HandleKind {
    File {
        /// Opened with O_SYNC or O_DSYNC: each write is also a sync.
        sync_writes: bool,
        /// The backing file (closed and opened again under a bound, see
        /// [`Passthrough::max_open_files`]).
        slot: Arc<Slot>,
    },
    Dir {
        file: Arc<File>,
        /// The listing served by READDIR, taken when it starts at offset 0.
        listing: Mutex<Vec<Listed>>,
    },
}

/// One directory entry as READDIR returns it.
struct Listed {
    ino: u64,
    kind: FileType,
    name: OsString,
}

/// What one SETATTR changes (`None`: left as it is).
struct Changes {
    mode: Option<u32>,
    uid: Option<u32>,
    gid: Option<u32>,
    size: Option<u64>,
    atime: Option<TimeOrNow>,
    mtime: Option<TimeOrNow>,
}

/// The file an operation is on: its inode, and its path relative to the
/// backing directory (`None` once unlinked).
#[derive(Clone, Debug)]
pub struct Node {
    pub ino: u64,
    pub path: Option<PathBuf>,
}

impl std::fmt::Display for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.path {
            Some(path) if path.as_os_str().is_empty() => f.write_str("/"),
            Some(path) => write!(f, "{}", path.display()),
            None => write!(f, "<unlinked inode {}>", self.ino),
        }
    }
}

/// What a user of the passthrough adds to it. Every method has a default
/// that does nothing; an error refuses the operation with that errno
/// before the backing file is touched.
pub trait Hooks: Send + Sync + 'static {
    /// Before `size` bytes at `offset` are read from `file` (the backing
    /// file, opened as the caller asked).
    fn before_read(&self, _node: &Node, _file: &File, _offset: u64, _size: u32) -> Result<()> {
        Ok(())
    }

    /// Before `data` is written at `offset`; `sync`: the file was opened
    /// with O_SYNC or O_DSYNC, so the write is also a sync.
    fn before_write(&self, _node: &Node, _file: &File, _offset: u64, _data: &[u8], _sync: bool) -> Result<()> {
        Ok(())
    }

    /// After `data` was written at `offset` (what was written, which may be
    /// less than asked).
    fn after_write(&self, _node: &Node, _file: &File, _offset: u64, _data: &[u8]) {}

    /// Before an fsync (`op`: `fsync`, `fdatasync` or `directory fsync`).
    fn before_fsync(&self, _node: &Node, _op: &str) -> Result<()> {
        Ok(())
    }

    /// Before an fallocate.
    fn before_fallocate(&self, _node: &Node) -> Result<()> {
        Ok(())
    }

    /// After the file's size was set to `size` (truncate, ftruncate, or
    /// O_TRUNC on open).
    fn after_set_size(&self, _node: &Node, _size: u64) {}

    /// After a file was created (not on an open of an existing file).
    fn after_create(&self, _node: &Node) {}

    /// After `path` was removed.
    fn after_unlink(&self, _path: &Path) {}

    /// After `from` was renamed to `to` (replacing what `to` was).
    fn after_rename(&self, _from: &Path, _to: &Path) {}

    /// Before `path` is looked up in the backing directory (a lookup, or a
    /// create that may open an existing file): a user that serves files it
    /// has not written to the backing directory yet creates it now.
    fn before_lookup(&self, _path: &Path) -> Result<()> {
        Ok(())
    }

    /// Files of directory `dir` that a user serves but has not created in
    /// the backing directory yet (see [`Hooks::before_lookup`]): listed
    /// with the directory's entries.
    fn pending_entries(&self, _dir: &Path) -> Vec<OsString> {
        Vec::new()
    }

    /// Serves a read; `read` reads the backing file. By default
    /// [`Hooks::before_read`], then `read`. A user that must keep the
    /// backing bytes still while they are read (they may change under a
    /// concurrent request) holds its lock around `read`.
    fn serve_read(
        &self,
        node: &Node,
        file: &File,
        offset: u64,
        size: u32,
        read: &mut dyn FnMut() -> Result<Vec<u8>>,
    ) -> Result<Vec<u8>> {
        self.before_read(node, file, offset, size)?;
        read()
    }

    /// Serves a write; `write` writes `data` to the backing file and
    /// returns how much it wrote. By default [`Hooks::before_write`],
    /// `write`, then [`Hooks::after_write`] with what was written.
    fn serve_write(
        &self,
        node: &Node,
        file: &File,
        offset: u64,
        data: &[u8],
        sync: bool,
        write: &mut dyn FnMut() -> Result<u32>,
    ) -> Result<u32> {
        self.before_write(node, file, offset, data, sync)?;
        let written = write()?;
        self.after_write(node, file, offset, &data[..written as usize]);
        Ok(written)
    }

    /// Serves a truncate or ftruncate; `set` sets the backing file's size.
    /// By default `set`, then [`Hooks::after_set_size`]. A user whose own
    /// writes to the file must not land between the two holds its lock
    /// around both.
    fn serve_set_size(&self, node: &Node, size: u64, set: &mut dyn FnMut() -> Result<()>) -> Result<()> {
        set()?;
        self.after_set_size(node, size);
        Ok(())
    }
}

/// The FUSE file system over a backing directory.
pub struct Passthrough<H: Hooks> {
    /// The backing directory (absolute, no symlinks).
    root: PathBuf,
    inodes: Mutex<Inodes>,
    handles: Mutex<HashMap<u64, Arc<Handle>>>,
    next_fh: AtomicU64,
    hooks: H,
    /// The daemon's effective uid and gid, when it is root: new files and
    /// directories are then given to the calling user, as a kernel file
    /// system would create them.
    root_ids: Option<(u32, u32)>,
    /// How long the kernel may cache attributes and names.
    ttl: Duration,
    /// Whether an open keeps the file's pages the kernel already caches.
    keep_cache: bool,
    /// Whether the kernel is asked to cache writes ([`Passthrough::writeback_cache`]).
    writeback: bool,
    /// The bound on open backing files, if any.
    open_files: OpenFiles,
}

/// A result whose error is the errno the kernel gets.
pub type Result<T> = std::result::Result<T, Errno>;

/// The errno of an I/O error (EIO if it carries none).
fn errno(e: io::Error) -> Errno {
    Errno::from(e)
}

fn file_type(mode: u32) -> FileType {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => FileType::Directory,
        libc::S_IFLNK => FileType::Symlink,
        libc::S_IFIFO => FileType::NamedPipe,
        libc::S_IFSOCK => FileType::Socket,
        libc::S_IFCHR => FileType::CharDevice,
        libc::S_IFBLK => FileType::BlockDevice,
        _ => FileType::RegularFile,
    }
}

/// FUSE attributes of `ino` from the backing file's metadata.
fn attr(ino: u64, m: &Metadata) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size: m.size(),
        blocks: m.blocks(),
        atime: sys::system_time(m.atime(), m.atime_nsec()),
        mtime: sys::system_time(m.mtime(), m.mtime_nsec()),
        ctime: sys::system_time(m.ctime(), m.ctime_nsec()),
        crtime: sys::system_time(m.ctime(), m.ctime_nsec()),
        kind: file_type(m.mode()),
        perm: (m.mode() & 0o7777) as u16,
        nlink: m.nlink() as u32,
        uid: m.uid(),
        gid: m.gid(),
        rdev: m.rdev() as u32,
        blksize: m.blksize() as u32,
        flags: 0,
    }
}

/// Opens a backing file with the flags the caller gave to open(2) or creat(2).
fn open_backing(path: &Path, flags: i32, create_mode: Option<u32>) -> io::Result<File> {
    let mut options = OpenOptions::new();
    match flags & libc::O_ACCMODE {
        libc::O_WRONLY => options.write(true),
        libc::O_RDWR => options.read(true).write(true),
        _ => options.read(true),
    };
    // The other flags go through as they are (O_APPEND, O_SYNC, O_DSYNC,
    // O_NOATIME, O_TRUNC, O_EXCL...), except: O_DIRECT, which would demand
    // aligned buffers of this daemon (durability comes from fsync, which we
    // pass on); O_NOCTTY, meaningless here; O_CREAT, set only for CREATE.
    let mut custom = flags & !(libc::O_ACCMODE | libc::O_DIRECT | libc::O_NOCTTY | libc::O_CREAT) | libc::O_CLOEXEC;
    if let Some(mode) = create_mode {
        // O_CREAT as a custom flag rather than `create(true)`: the standard
        // library refuses that for read-only opens, which open(2) allows.
        custom |= libc::O_CREAT;
        options.mode(mode);
    }
    options.custom_flags(custom);
    options.open(path)
}

impl<H: Hooks> Passthrough<H> {
    /// A file system serving `root` (absolute, without symlinks), changed by `hooks`.
    pub fn new(root: PathBuf, hooks: H) -> Passthrough<H> {
        let (uid, gid) = sys::effective_ids();
        Passthrough {
            root,
            inodes: Mutex::new(Inodes::new()),
            handles: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            hooks,
            root_ids: (uid == 0).then_some((uid, gid)),
            ttl: Duration::ZERO,
            keep_cache: false,
            writeback: false,
            open_files: OpenFiles::new(None),
        }
    }

    /// Holds at most about `max` backing files of open handles open at once
    /// (`crate::open_files`): a handle not used lately has its descriptor
    /// closed and opened again by path when next used. Without this, every
    /// open handle holds a descriptor for as long as it is open.
    pub fn max_open_files(mut self, max: usize) -> Passthrough<H> {
        self.open_files = OpenFiles::new(Some(max));
        self
    }

    /// The backing directory changes through this mount alone: the kernel
    /// may cache attributes and names for `ttl` and keep file pages across
    /// opens. Without this, every `lseek(SEEK_END)` and `stat` is a round
    /// trip to the daemon and every open drops the file's cached pages.
    pub fn exclusive(mut self, ttl: Duration) -> Passthrough<H> {
        self.ttl = ttl;
        self.keep_cache = true;
        self
    }

    /// The kernel keeps written pages and writes them back later, in larger
    /// requests, instead of sending each write(2) here before it returns
    /// (FUSE_WRITEBACK_CACHE, if the kernel offers it). Only for a mount
    /// that is [`Passthrough::exclusive`]: the kernel then owns the files'
    /// sizes and times. A failed write-back is reported by the next fsync,
    /// as a kernel file system reports it.
    pub fn writeback_cache(mut self) -> Passthrough<H> {
        self.writeback = true;
        self
    }

    /// The flags a backing file is opened with for open(2) `flags`. With the
    /// write-back cache, the kernel reads pages through any handle of the
    /// file (to fill a page partly written) and places appends itself.
    fn backing_flags(&self, flags: i32) -> i32 {
        if !self.writeback {
            return flags;
        }
        let flags = flags & !libc::O_APPEND;
        if flags & libc::O_ACCMODE == libc::O_WRONLY {
            flags & !libc::O_ACCMODE | libc::O_RDWR
        } else {
            flags
        }
    }

    fn open_flags(&self) -> FopenFlags {
        if self.keep_cache {
            FopenFlags::FOPEN_KEEP_CACHE
        } else {
            FopenFlags::empty()
        }
    }

    fn full(&self, rel: &Path) -> PathBuf {
        self.root.join(rel)
    }

    /// The relative path of `ino` (ENOENT once unlinked).
    fn path(&self, ino: INodeNo) -> Result<PathBuf> {
        self.inodes.lock().path(ino.0).map(Path::to_path_buf).ok_or(Errno::ENOENT)
    }

    /// The relative path of `name` in directory `parent`.
    fn child(&self, parent: INodeNo, name: &OsStr) -> Result<PathBuf> {
        let dir = self.path(parent)?;
        if name == "." {
            return Ok(dir);
        }
        if name == ".." {
            return Ok(dir.parent().map(Path::to_path_buf).unwrap_or_default());
        }
        Ok(dir.join(name))
    }

    /// The hooks' view of `ino`.
    fn node(&self, ino: u64) -> Node {
        Node { ino, path: self.inodes.lock().path(ino).map(Path::to_path_buf) }
    }

    /// The hooks given at creation.
    pub fn hooks(&self) -> &H {
        &self.hooks
    }

    fn handle(&self, fh: FileHandle) -> Result<Arc<Handle>> {
        self.handles.lock().get(&fh.0).cloned().ok_or(Errno::EBADF)
    }

    fn add_handle(&self, ino: u64, kind: HandleKind) -> FileHandle {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        let file = matches!(kind, HandleKind::File { .. });
        self.handles.lock().insert(fh, Arc::new(Handle { ino, kind }));
        if file {
            self.open_files.opened(fh, |f| self.slot_of(f));
        }
        FileHandle(fh)
    }

    fn slot_of(&self, fh: u64) -> Option<Arc<Slot>> {
        match &self.handles.lock().get(&fh)?.kind {
            HandleKind::File { slot, .. } => Some(slot.clone()),
            HandleKind::Dir { .. } => None,
        }
    }

    /// The backing file of handle `fh`, opened again by path if the bound
    /// closed it.
    fn file_of(&self, fh: u64, handle: &Handle) -> Result<Arc<File>> {
        let slot = match &handle.kind {
            HandleKind::Dir { file, .. } => return Ok(file.clone()),
            HandleKind::File { slot, .. } => slot,
        };
        if let Some(file) = slot.get() {
            return Ok(file);
        }
        let rel = self.path(INodeNo(handle.ino))?;
        let file = open_backing(&self.full(&rel), slot.reopen_flags, None).map_err(errno)?;
        let (file, mine) = slot.reopened(file);
        if mine {
            self.open_files.opened(fh, |f| self.slot_of(f));
        }
        Ok(file)
    }

    /// The backing file at `full` (of inode `ino`) is about to be unlinked
    /// or replaced: the handles open on it keep their descriptors for good,
    /// since it can no longer be opened by path. Called with the inode
    /// table locked.
    fn pin_handles(&self, ino: Option<u64>, full: &Path) {
        let Some(ino) = ino.filter(|_| self.open_files.bounded()) else { return };
        let slots: Vec<Arc<Slot>> = self
            .handles
            .lock()
            .values()
            .filter(|h| h.ino == ino)
            .filter_map(|h| match &h.kind {
                HandleKind::File { slot, .. } => Some(slot.clone()),
                HandleKind::Dir { .. } => None,
            })
            .collect();
        for slot in slots {
            if !slot.pin() {
                if let Ok(file) = open_backing(full, slot.reopen_flags, None) {
                    slot.reopened(file);
                    slot.pin();
                }
            }
        }
    }

    /// Metadata of `ino`: through the open handle if given, else its path,
    /// else (unlinked) any handle still open on it.
    fn stat(&self, ino: INodeNo, fh: Option<FileHandle>) -> Result<Metadata> {
        if let Some((fh, handle)) = fh.and_then(|fh| Some((fh, self.handle(fh).ok()?))) {
            return self.file_of(fh.0, &handle)?.metadata().map_err(errno);
        }
        if let Ok(path) = self.path(ino) {
            return fs::symlink_metadata(self.full(&path)).map_err(errno);
        }
        let open = self.handles.lock().iter().find(|(_, h)| h.ino == ino.0).map(|(fh, h)| (*fh, h.clone()));
        match open {
            Some((fh, handle)) => self.file_of(fh, &handle)?.metadata().map_err(errno),
            None => Err(Errno::ENOENT),
        }
    }

    /// Gives a newly created `path` to the caller when we run as root.
    fn chown_new(&self, req: &Request, path: &Path) -> Result<()> {
        match self.root_ids {
            Some(ids) if ids != (req.uid(), req.gid()) => {
                std::os::unix::fs::lchown(path, Some(req.uid()), Some(req.gid())).map_err(errno)
            }
            _ => Ok(()),
        }
    }

    /// Registers a new entry the kernel will hold (one lookup) and returns its attributes.
    fn entry(&self, rel: &Path) -> Result<FileAttr> {
        let meta = fs::symlink_metadata(self.full(rel)).map_err(errno)?;
        let ino = self.inodes.lock().lookup(rel);
        Ok(attr(ino, &meta))
    }

    fn do_setattr(&self, ino: INodeNo, fh: Option<FileHandle>, changes: Changes) -> Result<FileAttr> {
        let Changes { mode, uid, gid, size, atime, mtime } = changes;
        // By path while the file has one (an open handle may be read-only,
        // which ftruncate refuses); through the handle once unlinked.
        enum On {
            Path(PathBuf),
            Open(Arc<File>),
        }
        let on = match (self.path(ino), fh) {
            (Ok(rel), _) => On::Path(self.full(&rel)),
            (Err(_), Some(fh)) => On::Open(self.file_of(fh.0, &*self.handle(fh)?)?),
            (Err(e), None) => return Err(e),
        };
        // Owner first: chown clears set-id bits that a mode in the same request sets.
        if uid.is_some() || gid.is_some() {
            match &on {
                On::Path(path) => std::os::unix::fs::lchown(path, uid, gid),
                On::Open(f) => std::os::unix::fs::fchown(&**f, uid, gid),
            }
            .map_err(errno)?;
        }
        if let Some(mode) = mode {
            let perms = fs::Permissions::from_mode(mode & 0o7777);
            match &on {
                On::Path(path) => fs::set_permissions(path, perms),
                On::Open(f) => f.set_permissions(perms),
            }
            .map_err(errno)?;
        }
        if let Some(size) = size {
            self.hooks.serve_set_size(&self.node(ino.0), size, &mut || {
                match &on {
                    On::Path(path) => sys::truncate(path, size),
                    On::Open(f) => f.set_len(size),
                }
                .map_err(errno)
            })?;
        }
        // Times last, so that a size change in the same request does not move mtime after it was set.
        if atime.is_some() || mtime.is_some() {
            let target = match &on {
                On::Path(path) => sys::Target::Path(path),
                On::Open(f) => sys::Target::File(f),
            };
            sys::set_times(target, atime, mtime).map_err(errno)?;
        }
        Ok(attr(ino.0, &self.stat(ino, fh)?))
    }

    fn do_readdir(&self, ino: INodeNo, fh: FileHandle, offset: u64, reply: &mut ReplyDirectory) -> Result<()> {
        let handle = self.handle(fh)?;
        let HandleKind::Dir { listing, .. } = &handle.kind else { return Err(Errno::ENOTDIR) };
        let mut listing = listing.lock();
        if offset == 0 {
            *listing = self.list(ino)?;
        }
        // Offsets are positions in the listing: entry i says "continue at i + 1".
        for (i, entry) in listing.iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(entry.ino), i as u64 + 1, entry.kind, &entry.name) {
                break;
            }
        }
        Ok(())
    }

    /// The entries of directory `ino`, with `.` and `..` first.
    fn list(&self, ino: INodeNo) -> Result<Vec<Listed>> {
        let Ok(rel) = self.path(ino) else {
            // Removed while open: only the dot entries remain.
            return Ok(vec![
                Listed { ino: ino.0, kind: FileType::Directory, name: ".".into() },
                Listed { ino: ino.0, kind: FileType::Directory, name: "..".into() },
            ]);
        };
        let parent_ino = {
            let inodes = self.inodes.lock();
            rel.parent().and_then(|p| inodes.get(p)).unwrap_or(ino.0)
        };
        let mut out = vec![
            Listed { ino: ino.0, kind: FileType::Directory, name: ".".into() },
            Listed { ino: parent_ino, kind: FileType::Directory, name: "..".into() },
        ];
        // Taken before the directory is read: a file created meanwhile is
        // then in both, and listed once.
        let pending = self.hooks.pending_entries(&rel);
        let mut seen = std::collections::HashSet::new();
        for entry in fs::read_dir(self.full(&rel)).map_err(errno)? {
            let entry = entry.map_err(errno)?;
            // An entry removed since the directory was read is skipped.
            let Ok(file_type) = entry.file_type() else { continue };
            let kind = FileType::from_std(file_type).unwrap_or(FileType::RegularFile);
            // d_ino is informational (nothing looks files up by it): our inode
            // number when the kernel holds one, else the backing one.
            let ino = self.inodes.lock().get(&rel.join(entry.file_name())).unwrap_or(entry.ino());
            if !pending.is_empty() {
                seen.insert(entry.file_name());
            }
            out.push(Listed { ino, kind, name: entry.file_name() });
        }
        for name in pending.into_iter().filter(|n| !seen.contains(n)) {
            // Not in the backing directory yet, so no inode of its own: a
            // number of the range ours never reach.
            let ino = crate::limits::PENDING_INO | (out.len() as u64);
            out.push(Listed { ino, kind: FileType::RegularFile, name });
        }
        Ok(out)
    }

    fn do_fsync(&self, ino: INodeNo, fh: FileHandle, datasync: bool, op: &str) -> Result<()> {
        self.hooks.before_fsync(&self.node(ino.0), op)?;
        let file = self.file_of(fh.0, &*self.handle(fh)?)?;
        if datasync {
            file.sync_data().map_err(errno)
        } else {
            file.sync_all().map_err(errno)
        }
    }

    fn do_write(&self, ino: INodeNo, fh: FileHandle, offset: u64, data: &[u8]) -> Result<u32> {
        let handle = self.handle(fh)?;
        let file = self.file_of(fh.0, &handle)?;
        let node = self.node(ino.0);
        let sync = matches!(handle.kind, HandleKind::File { sync_writes: true, .. });
        self.hooks.serve_write(&node, &file, offset, data, sync, &mut || {
            // pwrite until all is written; after a partial write the error
            // is not reported, the count is (as write(2) does).
            let mut written = 0;
            while written < data.len() {
                match file.write_at(&data[written..], offset + written as u64) {
                    Ok(0) => break,
                    Ok(n) => written += n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) if written == 0 => return Err(errno(e)),
                    Err(_) => break,
                }
            }
            u32::try_from(written).map_err(|_| Errno::EINVAL)
        })
    }

    fn do_read(&self, ino: INodeNo, fh: FileHandle, offset: u64, size: u32) -> Result<Vec<u8>> {
        let file = self.file_of(fh.0, &*self.handle(fh)?)?;
        self.hooks.serve_read(&self.node(ino.0), &file, offset, size, &mut || {
            let mut buf = vec![0; size as usize];
            let mut read = 0;
            while read < buf.len() {
                match file.read_at(&mut buf[read..], offset + read as u64) {
                    Ok(0) => break,
                    Ok(n) => read += n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) if read == 0 => return Err(errno(e)),
                    Err(_) => break,
                }
            }
            buf.truncate(read);
            Ok(buf)
        })
    }

    fn do_rename(
        &self,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
    ) -> Result<()> {
        let (from, to) = (self.child(parent, name)?, self.child(newparent, newname)?);
        // The table stays locked across the rename so that nothing sees the
        // backing directory and the table disagree.
        let mut inodes = self.inodes.lock();
        let (full_from, full_to) = (self.full(&from), self.full(&to));
        self.pin_handles(inodes.get(&to), &full_to);
        if flags.is_empty() {
            fs::rename(&full_from, &full_to).map_err(errno)?;
        } else if flags == RenameFlags::RENAME_NOREPLACE {
            sys::rename_noreplace(&full_from, &full_to).map_err(errno)?;
        } else {
            // RENAME_EXCHANGE and RENAME_WHITEOUT are not supported.
            return Err(Errno::EINVAL);
        }
        inodes.renamed(&from, &to);
        drop(inodes);
        self.hooks.after_rename(&from, &to);
        Ok(())
    }
}

/// Answers a request from a `Result`: the value via `ok`, an error as its errno.
macro_rules! answer {
    ($reply:expr, $result:expr, |$v:pat_param| $ok:expr) => {
        match $result {
            Ok($v) => $ok,
            Err(e) => $reply.error(e),
        }
    };
}

impl<H: Hooks> Filesystem for Passthrough<H> {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        if self.writeback {
            if let Err(missing) = config.add_capabilities(InitFlags::FUSE_WRITEBACK_CACHE) {
                // Correct without it, only slower: each write is a round trip.
                warn!(root = %self.root.display(), "the kernel offers no write-back cache ({missing:?}): writes go through");
                self.writeback = false;
            }
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let result = self.child(parent, name).and_then(|rel| {
            self.hooks.before_lookup(&rel)?;
            self.entry(&rel)
        });
        answer!(reply, result, |a| reply.entry(&self.ttl, &a, GENERATION));
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.inodes.lock().forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        answer!(reply, self.stat(ino, fh), |m| reply.attr(&self.ttl, &attr(ino.0, &m)));
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<std::time::SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<std::time::SystemTime>,
        _chgtime: Option<std::time::SystemTime>,
        _bkuptime: Option<std::time::SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let result = self.do_setattr(ino, fh, Changes { mode, uid, gid, size, atime, mtime });
        answer!(reply, result, |a| reply.attr(&self.ttl, &a));
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let result = self.path(ino).and_then(|rel| fs::read_link(self.full(&rel)).map_err(errno));
        answer!(reply, result, |target| reply.data(target.as_os_str().as_encoded_bytes()));
    }

    fn mkdir(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        let result = self.child(parent, name).and_then(|rel| {
            let full = self.full(&rel);
            fs::DirBuilder::new().mode(mode & !umask & 0o7777).create(&full).map_err(errno)?;
            self.chown_new(req, &full)?;
            self.entry(&rel)
        });
        answer!(reply, result, |a| reply.entry(&self.ttl, &a, GENERATION));
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let result = self.child(parent, name).and_then(|rel| {
            let mut inodes = self.inodes.lock();
            let full = self.full(&rel);
            self.pin_handles(inodes.get(&rel), &full);
            fs::remove_file(&full).map_err(errno)?;
            inodes.unlinked(&rel);
            drop(inodes);
            self.hooks.after_unlink(&rel);
            Ok(())
        });
        answer!(reply, result, |()| reply.ok());
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let result = self.child(parent, name).and_then(|rel| {
            let mut inodes = self.inodes.lock();
            fs::remove_dir(self.full(&rel)).map_err(errno)?;
            inodes.unlinked(&rel);
            Ok(())
        });
        answer!(reply, result, |()| reply.ok());
    }

    fn symlink(&self, req: &Request, parent: INodeNo, link_name: &OsStr, target: &Path, reply: ReplyEntry) {
        let result = self.child(parent, link_name).and_then(|rel| {
            let full = self.full(&rel);
            std::os::unix::fs::symlink(target, &full).map_err(errno)?;
            self.chown_new(req, &full)?;
            self.entry(&rel)
        });
        answer!(reply, result, |a| reply.entry(&self.ttl, &a, GENERATION));
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let result = self.do_rename(parent, name, newparent, newname, flags);
        answer!(reply, result, |()| reply.ok());
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let result = self.path(ino).and_then(|rel| {
            let flags = self.backing_flags(flags.0);
            let file = open_backing(&self.full(&rel), flags, None).map_err(errno)?;
            if flags & libc::O_TRUNC != 0 {
                self.hooks.after_set_size(&Node { ino: ino.0, path: Some(rel) }, 0);
            }
            let sync_writes = flags & libc::O_DSYNC != 0;
            let slot = Arc::new(Slot::new(file, flags));
            Ok(self.add_handle(ino.0, HandleKind::File { sync_writes, slot }))
        });
        answer!(reply, result, |fh| reply.opened(fh, self.open_flags()));
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        answer!(reply, self.do_read(ino, fh, offset, size), |data| reply.data(&data));
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        answer!(reply, self.do_write(ino, fh, offset, data), |n| reply.written(n));
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        // Writes went to the backing file already (pwrite); nothing is buffered here.
        answer!(reply, self.handle(fh), |_| reply.ok());
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        // Dropping the last reference closes the backing file.
        self.handles.lock().remove(&fh.0);
        reply.ok();
    }

    fn fsync(&self, _req: &Request, ino: INodeNo, fh: FileHandle, datasync: bool, reply: ReplyEmpty) {
        let op = if datasync { "fdatasync" } else { "fsync" };
        answer!(reply, self.do_fsync(ino, fh, datasync, op), |()| reply.ok());
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let result = self.path(ino).and_then(|rel| {
            let dir = OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
                .open(self.full(&rel))
                .map_err(errno)?;
            Ok(self.add_handle(ino.0, HandleKind::Dir { file: Arc::new(dir), listing: Mutex::new(Vec::new()) }))
        });
        answer!(reply, result, |fh| reply.opened(fh, FopenFlags::empty()));
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        answer!(reply, self.do_readdir(ino, fh, offset, &mut reply), |()| reply.ok());
    }

    fn releasedir(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _flags: OpenFlags, reply: ReplyEmpty) {
        self.handles.lock().remove(&fh.0);
        reply.ok();
    }

    fn fsyncdir(&self, _req: &Request, ino: INodeNo, fh: FileHandle, datasync: bool, reply: ReplyEmpty) {
        answer!(reply, self.do_fsync(ino, fh, datasync, "directory fsync"), |()| reply.ok());
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        answer!(reply, sys::statvfs(&self.root).map_err(errno), |st| reply.statfs(
            st.f_blocks,
            st.f_bfree,
            st.f_bavail,
            st.f_files,
            st.f_ffree,
            st.f_bsize as u32,
            st.f_namemax as u32,
            st.f_frsize as u32,
        ));
    }

    fn access(&self, _req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        let result = self.path(ino).and_then(|rel| sys::access(&self.full(&rel), mask.bits()).map_err(errno));
        answer!(reply, result, |()| reply.ok());
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let result = self.child(parent, name).and_then(|rel| {
            // The kernel may create without looking up first (an O_CREAT
            // open of a name it has not cached): a file the hooks serve
            // exists, and is opened, not made anew.
            self.hooks.before_lookup(&rel)?;
            let full = self.full(&rel);
            let existed = fs::symlink_metadata(&full).is_ok();
            let flags = self.backing_flags(flags);
            let file = open_backing(&full, flags, Some(mode & !umask & 0o7777)).map_err(errno)?;
            self.chown_new(req, &full)?;
            let meta = file.metadata().map_err(errno)?;
            let ino = self.inodes.lock().lookup(&rel);
            let node = Node { ino, path: Some(rel) };
            if !existed {
                self.hooks.after_create(&node);
            } else if flags & libc::O_TRUNC != 0 {
                self.hooks.after_set_size(&node, 0);
            }
            let sync_writes = flags & libc::O_DSYNC != 0;
            let fh = self.add_handle(ino, HandleKind::File { sync_writes, slot: Arc::new(Slot::new(file, flags)) });
            Ok((attr(ino, &meta), fh))
        });
        answer!(reply, result, |(a, fh)| reply.created(&self.ttl, &a, GENERATION, fh, self.open_flags()));
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let result = self.handle(fh).and_then(|handle| {
            self.hooks.before_fallocate(&self.node(ino.0))?;
            let file = self.file_of(fh.0, &handle)?;
            sys::fallocate(&file, mode, offset, length).map_err(errno)
        });
        answer!(reply, result, |()| reply.ok());
    }
}
