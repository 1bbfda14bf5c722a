//! The FUSE file system: each kernel request answered from the mount's view (`view.rs`), open
//! files (`reader.rs`, `spool.rs`) and directory snapshots. Nothing a client sends can make it
//! panic: names that cannot be objects are refused, offsets past the end read nothing, and every
//! failure is an errno (logged with its cause).

use std::ffi::OsStr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use fuser::{
    BsdFileFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    InitFlags, KernelConfig, LockOwner, OpenAccMode, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request,
    TimeOrNow, WriteFlags,
};

use super::dirs::valid_name;
use super::handles::{DirItem, Handle, Handles};
use super::inodes::{child_path, parent_of, Kind};
use super::prefetch::Prefetcher;
use super::reader::Reader;
use super::spool::{Spool, State};
use super::view::{Found, View};
use super::writer_exit::{closer, tgid_of, Closer};

pub struct MemartsFs {
    view: View,
    handles: Handles,
    prefetch: Prefetcher,
}

impl MemartsFs {
    pub fn new(view: View, prefetch: Prefetcher) -> MemartsFs {
        MemartsFs { view, handles: Handles::default(), prefetch }
    }

    fn name<'a>(&self, name: &'a OsStr) -> Result<&'a str, Errno> {
        if name.len() > 255 {
            return Err(Errno::ENAMETOOLONG);
        }
        // Object keys are UTF-8.
        let name = name.to_str().ok_or(Errno::EINVAL)?;
        if valid_name(name) {
            Ok(name)
        } else {
            Err(Errno::EINVAL)
        }
    }

    fn writable(&self) -> Result<(), Errno> {
        if self.view.opts.read_only {
            Err(Errno::EROFS)
        } else {
            Ok(())
        }
    }

    fn reply_entry(&self, reply: ReplyEntry, attr: &FileAttr) {
        reply.entry_with_ttls(&self.view.opts.attr_timeout, &self.view.entry_ttl(), attr, Generation(0));
    }

    fn lookup_inner(&self, parent: u64, name: &OsStr) -> Result<Option<FileAttr>, Errno> {
        let Ok(name) = self.name(name) else { return Ok(None) };
        let dir = self.view.dir_node(parent)?;
        let (path, found) = self.view.find(&dir.path, name)?;
        Ok(self.view.learn(&path, found))
    }

    fn open_read(&self, ino: u64) -> Result<(u64, FopenFlags), Errno> {
        let node = self.view.node(ino)?;
        let meta = self.view.current_meta(ino, &node)?;
        let keep = {
            let mut inodes = self.view.inodes();
            let n = inodes.get_mut(ino).ok_or(Errno::ENOENT)?;
            let same = n.last_open_etag.is_some() && n.last_open_etag == meta.etag;
            n.last_open_etag = meta.etag.clone();
            self.view.opts.kernel_cache || same
        };
        let url = self.view.opts.url_of(&node.path);
        let reader = Reader::new(self.view.fleet.clone(), url, meta, self.view.opts.max_readahead);
        let fh = self.handles.insert(Handle::Read(Arc::new(reader)));
        // A file open for reading has nothing to do at close: no FLUSH round trip per close.
        let flags = FopenFlags::FOPEN_NOFLUSH;
        Ok((fh, if keep { flags | FopenFlags::FOPEN_KEEP_CACHE } else { flags }))
    }

    /// A new spool for `path`, the one writer it may have.
    fn open_write(&self, path: &str, opener: u32) -> Result<u64, Errno> {
        self.writable()?;
        let mut writers = self.view.writers();
        if writers.contains_key(path) {
            eprintln!("memarts mount: {path} is already open for writing: one writer per file");
            return Err(Errno::EPERM);
        }
        let url = self.view.opts.url_of(path);
        let spool =
            Spool::new(&self.view.opts.spool_dir, path.to_string(), url, tgid_of(opener)).map_err(|e| {
                eprintln!("memarts mount: spool file in {}: {e}", self.view.opts.spool_dir.display());
                e.raw_os_error().map_or(Errno::EIO, Errno::from_i32)
            })?;
        let spool = Arc::new(Mutex::new(spool));
        writers.insert(path.to_string(), spool.clone());
        drop(writers);
        Ok(self.handles.insert(Handle::Write(spool)))
    }

    /// The close of a file being written by the process that opened it: publish (upload) it,
    /// unless that process is being killed.
    fn close_write(&self, spool: &Mutex<Spool>, pid: u32) -> Result<(), Errno> {
        let mut s = spool.lock().unwrap_or_else(|p| p.into_inner());
        if tgid_of(pid) != s.opener {
            // Another process's copy of the descriptor (a forked child) closes: not the end.
            return Ok(());
        }
        match s.state {
            State::Open => {}
            State::Published | State::Discarded => return Ok(()),
            State::Failed(e) => {
                let path = s.path.clone();
                drop(s);
                self.end_write(&path);
                return Err(e);
            }
        }
        match closer(pid) {
            Closer::Alive => {}
            how => {
                eprintln!(
                    "memarts mount: the writer of {} ended ({how:?}) before closing it: nothing published",
                    s.url
                );
                s.state = State::Discarded;
                let path = s.path.clone();
                // Never wait for the writers' map while holding a spool: `learn` locks them the
                // other way round.
                drop(s);
                self.end_write(&path);
                return Ok(());
            }
        }
        if s.len() == 0 {
            s.closed_empty = true;
            return Ok(());
        }
        self.publish(s)
    }

    /// Uploads the spool and makes the mount's view show the new object.
    fn publish(&self, mut s: std::sync::MutexGuard<'_, Spool>) -> Result<(), Errno> {
        let result = s.publish(&self.view.fleet);
        let path = s.path.clone();
        drop(s);
        self.end_write(&path);
        let meta = result?;
        let mut inodes = self.view.inodes();
        if let Some(ino) = inodes.ino_of(&path) {
            if let Some(n) = inodes.get_mut(ino) {
                n.meta = Some(meta);
                n.checked = std::time::Instant::now();
                n.last_open_etag = None;
            }
        }
        Ok(())
    }

    /// `path` has no writer any more; its directory's listing is out of date.
    fn end_write(&self, path: &str) {
        self.view.writers().remove(path);
        self.view.dirs().invalidate_up(parent_of(path));
    }

    fn snapshot(&self, ino: u64) -> Result<Vec<DirItem>, Errno> {
        let dir = self.view.dir_node(ino)?;
        let listed = self.view.listing(&dir.path)?;
        let mut items: std::collections::BTreeMap<String, FileType> = std::collections::BTreeMap::new();
        for e in listed.iter() {
            let kind = if e.kind == Kind::Dir { FileType::Directory } else { FileType::RegularFile };
            items.insert(e.name.clone(), kind);
        }
        for name in self.view.dirs().local_children(&dir.path) {
            items.entry(name).or_insert(FileType::Directory);
        }
        let prefix = if dir.path.is_empty() { String::new() } else { format!("{}/", dir.path) };
        for path in self.view.writers().keys() {
            if let Some(name) = path.strip_prefix(&prefix).filter(|n| !n.contains('/')) {
                items.insert(name.to_string(), FileType::RegularFile);
            }
        }
        let inodes = self.view.inodes();
        Ok(items
            .into_iter()
            .map(|(name, kind)| {
                let path = child_path(&dir.path, &name);
                // Inode numbers are handed out by lookup; an entry not looked up yet gets a stable
                // stand-in (readdir's numbers are informative, the kernel looks names up).
                let ino = inodes.ino_of(&path).unwrap_or_else(|| stand_in_ino(&path));
                DirItem { ino, kind, name }
            })
            .collect())
    }
}

fn stand_in_ino(path: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::hash::DefaultHasher::new();
    path.hash(&mut h);
    h.finish() | (1 << 63)
}

impl Filesystem for MemartsFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // O_TRUNC arrives with open, so `open(O_WRONLY|O_TRUNC)` of an existing object starts a
        // new version instead of a truncate the mount would have to refuse.
        let _ = config.add_capabilities(InitFlags::FUSE_ATOMIC_O_TRUNC);
        let _ = config.set_max_readahead(1 << 20);
        let _ = config.set_max_background(64);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.lookup_inner(parent.0, name) {
            Ok(Some(attr)) => self.reply_entry(reply, &attr),
            Ok(None) if !self.view.opts.negative_timeout.is_zero() => {
                // Inode 0: the kernel keeps the name as missing for the negative timeout.
                let mut attr = self.view.opts.dir_attr(0);
                attr.ino = INodeNo(0);
                reply.entry_with_ttls(
                    &Duration::ZERO,
                    &self.view.opts.negative_timeout,
                    &attr,
                    Generation(0),
                );
            }
            Ok(None) => reply.error(Errno::ENOENT),
            Err(e) => reply.error(e),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.view.inodes().forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let ttl = self.view.opts.attr_timeout;
        if let Some(Handle::Read(r)) = fh.and_then(|fh| self.handles.get(fh.0)) {
            // An open file is the version its open pinned.
            let attr = self.view.opts.file_attr(ino.0, r.meta.size, r.meta.last_modified_ms);
            return reply.attr(&ttl, &attr);
        }
        match self.view.attr(ino.0) {
            Ok(attr) => reply.attr(&ttl, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        // Mode, owner and times are the mount's, not the object's: accepted and left as they are.
        if let Some(size) = size {
            let node = match self.view.node(ino.0) {
                Ok(n) => n,
                Err(e) => return reply.error(e),
            };
            let spool = self.view.writers().get(&node.path).cloned();
            let same = spool.is_some_and(|s| s.lock().unwrap_or_else(|p| p.into_inner()).len() == size);
            if !same {
                if let Err(e) = self.writable() {
                    return reply.error(e);
                }
                eprintln!(
                    "memarts mount: truncate of {} to {size} refused: objects are written whole",
                    node.path
                );
                return reply.error(Errno::EOPNOTSUPP);
            }
        }
        match self.view.attr(ino.0) {
            Ok(attr) => reply.attr(&self.view.opts.attr_timeout, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let made = (|| {
            self.writable()?;
            let name = self.name(name)?;
            let dir = self.view.dir_node(parent.0)?;
            let (path, found) = self.view.find(&dir.path, name)?;
            if !matches!(found, Found::Missing) {
                return Err(Errno::EEXIST);
            }
            // Local to this mount until a file is written below it: object stores have no
            // directories, a prefix exists while something is under it.
            self.view.dirs().add_local(&path);
            self.view.dirs().invalidate_up(&dir.path);
            self.view.learn(&path, Found::Dir).ok_or(Errno::EIO)
        })();
        match made {
            Ok(attr) => self.reply_entry(reply, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let done = (|| {
            self.writable()?;
            let name = self.name(name)?;
            let dir = self.view.dir_node(parent.0)?;
            let path = child_path(&dir.path, name);
            if self.view.writers().contains_key(&path) {
                eprintln!("memarts mount: unlink of {path} refused while it is being written");
                return Err(Errno::EBUSY);
            }
            let url = self.view.opts.url_of(&path);
            self.view
                .fleet
                .client()
                .delete(&url)
                .map_err(|e| super::errno::failed(&format!("delete {url}"), &e))?;
            self.view.inodes().detach(&path);
            self.view.dirs().invalidate_up(&dir.path);
            Ok(())
        })();
        match done {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let done = (|| {
            self.writable()?;
            let name = self.name(name)?;
            let dir = self.view.dir_node(parent.0)?;
            let path = child_path(&dir.path, name);
            let prefix = format!("{path}/");
            if self.view.dirs().has_local_below(&path)
                || self.view.writers().keys().any(|w| w.starts_with(&prefix))
            {
                return Err(Errno::ENOTEMPTY);
            }
            let url = self.view.opts.url_of(&path);
            match self.view.fleet.client().list_page(&url, false, None, 1) {
                Ok(page) if !page.entries.is_empty() => return Err(Errno::ENOTEMPTY),
                Ok(_) | Err(memarts_shim::Error::NotFound(_)) => {}
                Err(e) => return Err(super::errno::failed(&format!("list {url}"), &e)),
            }
            if !self.view.dirs().is_local(&path) {
                return Err(Errno::ENOENT);
            }
            self.view.dirs().remove_local(&path);
            self.view.dirs().invalidate_up(&dir.path);
            self.view.inodes().detach(&path);
            Ok(())
        })();
        match done {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rename(
        &self,
        _req: &Request,
        _parent: INodeNo,
        name: &OsStr,
        _newparent: INodeNo,
        _newname: &OsStr,
        _flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        if let Err(e) = self.writable() {
            return reply.error(e);
        }
        eprintln!(
            "memarts mount: rename of {name:?} refused: object stores have no rename (copy, then delete)"
        );
        reply.error(Errno::EOPNOTSUPP);
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let node = match self.view.node(ino.0) {
            Ok(n) if n.kind == Kind::Dir => return reply.error(Errno::EISDIR),
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        if flags.acc_mode() == OpenAccMode::O_RDONLY {
            return match self.open_read(ino.0) {
                Ok((fh, keep)) => reply.opened(FileHandle(fh), keep),
                Err(e) => reply.error(e),
            };
        }
        if let Err(e) = self.writable() {
            return reply.error(e);
        }
        if flags.0 & libc::O_TRUNC == 0 {
            eprintln!(
                "memarts mount: {} opened for writing without O_TRUNC: objects are written whole, \
                 from the start (no appends, no updates in place)",
                node.path
            );
            return reply.error(Errno::EOPNOTSUPP);
        }
        match self.open_write(&node.path, req.pid()) {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let made = (|| {
            self.writable()?;
            let name = self.name(name)?;
            let dir = self.view.dir_node(parent.0)?;
            let path = child_path(&dir.path, name);
            if self.view.dirs().is_local(&path) {
                return Err(Errno::EISDIR);
            }
            let fh = self.open_write(&path, req.pid())?;
            let attr = self.view.learn(&path, Found::Writing).ok_or(Errno::EIO)?;
            if let Some(n) = self.view.inodes().get_mut(attr.ino.0) {
                n.meta = None;
            }
            Ok((fh, attr))
        })();
        match made {
            Ok((fh, attr)) => reply.created(
                &self.view.opts.attr_timeout,
                &attr,
                Generation(0),
                FileHandle(fh),
                FopenFlags::empty(),
            ),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let data = match self.handles.get(fh.0) {
            Some(Handle::Read(r)) => r.read(offset, size, &self.prefetch),
            Some(Handle::Write(s)) => s.lock().unwrap_or_else(|p| p.into_inner()).read(offset, size),
            _ => Err(Errno::EBADF),
        };
        match data {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.handles.get(fh.0) {
            Some(Handle::Write(s)) => match s.lock().unwrap_or_else(|p| p.into_inner()).write(offset, data) {
                Ok(n) => reply.written(n),
                Err(e) => reply.error(e),
            },
            _ => reply.error(Errno::EBADF),
        }
    }

    fn flush(&self, req: &Request, _ino: INodeNo, fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        match self.handles.get(fh.0) {
            Some(Handle::Write(s)) => match self.close_write(&s, req.pid()) {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e),
            },
            _ => reply.ok(),
        }
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
        match self.handles.remove(fh.0) {
            Some(Handle::Read(r)) => r.close(),
            Some(Handle::Write(spool)) => {
                let mut s = spool.lock().unwrap_or_else(|p| p.into_inner());
                if s.state == State::Open && s.closed_empty {
                    // Its opener closed it alive and nothing said otherwise since (an empty file,
                    // or a `dd` that wrote through a dup'ed descriptor and was not killed).
                    let url = s.url.clone();
                    if let Err(e) = self.publish(s) {
                        eprintln!("memarts mount: {url}: upload at release failed ({e:?})");
                    }
                    s = spool.lock().unwrap_or_else(|p| p.into_inner());
                } else if s.state == State::Open {
                    // The opener never closed it (it was killed, or its close came from elsewhere).
                    eprintln!(
                        "memarts mount: {} released without its writer's close: nothing published",
                        s.url
                    );
                    s.state = State::Discarded;
                }
                let path = s.path.clone();
                drop(s);
                let mut writers = self.view.writers();
                // The path may have a new writer by now: only this one's entry goes.
                if writers.get(&path).is_some_and(|w| Arc::ptr_eq(w, &spool)) {
                    writers.remove(&path);
                }
            }
            _ => {}
        }
        reply.ok();
    }

    fn fsync(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        // A file being written becomes durable (at the origin) when it is closed, not before.
        reply.ok();
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.snapshot(ino.0) {
            Ok(items) => {
                let fh = self.handles.insert(Handle::Dir(Arc::new(items)));
                reply.opened(FileHandle(fh), FopenFlags::empty());
            }
            Err(e) => reply.error(e),
        }
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let Some(Handle::Dir(items)) = self.handles.get(fh.0) else { return reply.error(Errno::EBADF) };
        let parent = self.view.node(ino.0).ok().and_then(|n| {
            let p = parent_of(&n.path).to_string();
            if n.path.is_empty() {
                None
            } else {
                self.view.inodes().ino_of(&p)
            }
        });
        let dots = [(ino.0, "."), (parent.unwrap_or(ino.0), "..")];
        let all = dots
            .iter()
            .map(|&(i, n)| (i, FileType::Directory, n))
            .chain(items.iter().map(|d| (d.ino, d.kind, d.name.as_str())));
        for (i, (ino, kind, name)) in all.enumerate().skip(offset as usize) {
            if reply.add(INodeNo(ino), (i + 1) as u64, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.handles.remove(fh.0);
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        // An object store has no fixed size: report plenty of room, so tools that check first
        // (installers, some writers) go ahead.
        const BLOCKS: u64 = 1 << 40;
        reply.statfs(BLOCKS, BLOCKS, BLOCKS, 1 << 32, 1 << 32, 4096, 255, 4096);
    }
}
