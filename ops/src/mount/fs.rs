//! The FUSE file system: each kernel request answered from the mount's view (`view.rs`), open
//! files (`reader.rs`, `spool.rs`) and directory snapshots. Nothing a client sends can make it
//! panic: names that cannot be objects are refused, offsets past the end read nothing, and every
//! failure is an errno (logged with its cause).

use std::ffi::OsStr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use fuser::{
    BsdFileFlags, Errno, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, OpenAccMode, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow,
    WriteFlags,
};

use super::handles::{Handle, Handles};
use super::inodes::{child_path, parent_of, Kind};
use super::spool::State;
use super::view::{Found, View};

pub struct MemartsFs {
    pub(super) view: View,
    pub(super) handles: Handles,
}

impl MemartsFs {
    pub fn new(view: View) -> MemartsFs {
        MemartsFs { view, handles: Handles::default() }
    }
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
            let attr = self.view.opts.file_attr(ino.0, r.meta().size, r.meta().last_modified_ms);
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
            Some(Handle::Read(r)) => r.read(offset, size),
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
