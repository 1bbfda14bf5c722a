//! The fleet's chunk files as local reads open them (S9): relative to the chunks directory, held
//! open (no walk of the cache dir's path for every chunk); non-blocking, so that a named pipe at a
//! chunk's path cannot hold the open (the slot removes such things); without updating the access
//! time (`O_NOATIME`, which the kernel allows on files of our own uid only); and only if the file
//! belongs to the fleet's uid. A file of another owner was not written by a slot: someone with
//! access to the cache dir planted it, and a well-formed chunk passes every check (a CRC32C is no
//! MAC). It is never read here: the read treats it as a chunk that failed its checks, so the slot
//! drops it and serves the chunk itself.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use memarts_disk::chunk_file::ChunkId;
use nix::fcntl::{openat, OFlag};
use nix::sys::stat::Mode;

/// What looking for a chunk's file found.
#[derive(Debug)]
pub(crate) enum Opened {
    /// The file, of the fleet's uid.
    File(File),
    /// No file, or one that cannot be opened: ask the slot.
    Absent,
    /// A file of another owner: never read, to be dropped by the slot.
    Foreign,
}

impl Opened {
    /// The file, if one of the fleet's uid was found.
    pub fn file(self) -> Option<File> {
        match self {
            Opened::File(file) => Some(file),
            _ => None,
        }
    }
}

/// The chunks directory of a fleet's cache and the uid its files must belong to.
pub(crate) struct ChunkFiles {
    chunks: PathBuf,
    dir: Mutex<Option<Arc<OwnedFd>>>,
    /// The fleet's uid: the owner of its run dir, which its proxies run as.
    owner: u32,
}

impl ChunkFiles {
    pub fn new(chunks: PathBuf, owner: u32) -> ChunkFiles {
        ChunkFiles { chunks, dir: Mutex::default(), owner }
    }

    /// The file of chunk `id` (see the module docs).
    pub fn open(&self, id: ChunkId) -> Opened {
        let Some(dir) = self.dir() else { return Opened::Absent };
        let name = memarts_disk::chunk_file::chunk_relative_path(id);
        let flags = OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC | OFlag::O_NOATIME;
        // EPERM (O_NOATIME on another owner's file, for a process without CAP_FOWNER) is no file
        // of ours either: refused like one of another owner, not opened again without the flag.
        let file = match openat(&dir, name.as_str(), flags, Mode::empty()) {
            Ok(fd) => File::from(fd),
            Err(nix::errno::Errno::EPERM) => return Opened::Foreign,
            Err(_) => return Opened::Absent,
        };
        match file.metadata() {
            Ok(meta) if meta.uid() == self.owner => Opened::File(file),
            Ok(_) => Opened::Foreign,
            Err(_) => Opened::Absent,
        }
    }

    /// The chunks directory, opened once it exists.
    fn dir(&self) -> Option<Arc<OwnedFd>> {
        let mut dir = self.dir.lock().unwrap_or_else(|p| p.into_inner());
        if dir.is_none() {
            let flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
            *dir = nix::fcntl::open(&self.chunks, flags, Mode::empty()).ok().map(Arc::new);
        }
        dir.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memarts_disk::chunk_file::chunk_path;

    /// A chunk file (any bytes) of chunk `id` under a new cache's chunks directory.
    fn cache_with(id: ChunkId) -> (tempfile::TempDir, PathBuf, PathBuf) {
        let cache = tempfile::tempdir().unwrap();
        let chunks = cache.path().join("v1/chunks");
        let path = chunk_path(&chunks, id);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, b"a chunk").unwrap();
        (cache, chunks, path)
    }

    #[test]
    fn only_files_of_the_fleets_uid_are_opened() {
        let id = ChunkId(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef);
        let (_cache, chunks, _) = cache_with(id);
        let me = nix::unistd::geteuid().as_raw();
        assert!(matches!(ChunkFiles::new(chunks.clone(), me).open(id), Opened::File(_)));
        assert!(matches!(ChunkFiles::new(chunks.clone(), me.wrapping_add(1)).open(id), Opened::Foreign));
        assert!(matches!(ChunkFiles::new(chunks.clone(), me).open(ChunkId(1)), Opened::Absent));
        assert!(matches!(ChunkFiles::new(chunks.join("absent"), me).open(id), Opened::Absent));
    }

    #[test]
    fn a_chunk_file_chowned_to_another_uid_is_refused() {
        if !nix::unistd::geteuid().is_root() {
            panic!("this test chowns a file to another uid: run it as root (CI does)");
        }
        let id = ChunkId(7);
        let (_cache, chunks, path) = cache_with(id);
        nix::unistd::chown(&path, Some(nix::unistd::Uid::from_raw(65534)), None).unwrap();
        assert!(matches!(ChunkFiles::new(chunks, 0).open(id), Opened::Foreign));
    }
}
