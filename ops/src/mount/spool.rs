//! One file being written: its bytes go to a private, unnamed temp file (never memory), in order
//! only, and are uploaded whole (a multipart upload through the fleet for large files) when the
//! process that opened it closes it (with the bytes written so far; a close before any write waits
//! for the release, see `closed_empty`). Until then the origin is untouched, so a writer that dies
//! publishes nothing; an upload that fails fails the `close`.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use fuser::Errno;
use memarts_shim::ObjectMeta;

use super::errno::failed;
use super::Fleet;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Open,
    Published,
    /// Dropped unpublished (the writer was killed): nothing reaches the origin.
    Discarded,
    /// The upload failed with this errno; the origin keeps what it had.
    Failed(Errno),
}

pub struct Spool {
    pub path: String,
    pub url: String,
    file: File,
    len: u64,
    /// The process (thread group) that opened the file: its `close` publishes.
    pub opener: u32,
    pub state: State,
    /// The opener closed a descriptor of the file before writing anything, alive: an empty file
    /// (`touch`), or a program that opens, `dup2`s and closes the first descriptor (`dd` does).
    /// Published at release unless a later close says otherwise.
    pub closed_empty: bool,
}

impl Spool {
    pub fn new(dir: &Path, path: String, url: String, opener: u32) -> std::io::Result<Spool> {
        let file = tempfile::tempfile_in(dir)?;
        Ok(Spool { path, url, file, len: 0, opener, state: State::Open, closed_empty: false })
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    /// Appends `data`, which must start where the file ends: objects are written whole, so a
    /// write anywhere else (a seek back, a hole) is refused with `EOPNOTSUPP`.
    pub fn write(&mut self, offset: u64, data: &[u8]) -> Result<u32, Errno> {
        match self.state {
            State::Open => {}
            State::Failed(e) => return Err(e),
            _ => {
                eprintln!("memarts mount: write to {} after its close published or dropped it", self.url);
                return Err(Errno::EBADF);
            }
        }
        if offset != self.len {
            eprintln!(
                "memarts mount: write to {} at offset {offset}, but it ends at {}: objects are written \
                 in order only (no random writes)",
                self.url, self.len
            );
            // The program meant another object than the one spooled: publish nothing, and say so
            // again at close.
            self.state = State::Failed(Errno::EOPNOTSUPP);
            return Err(Errno::EOPNOTSUPP);
        }
        self.file.write_all_at(data, offset).map_err(|e| {
            eprintln!("memarts mount: spooling {}: {e}", self.url);
            e.raw_os_error().map_or(Errno::EIO, Errno::from_i32)
        })?;
        self.len += data.len() as u64;
        Ok(data.len() as u32)
    }

    /// Reads back what was written (a file opened `w+`).
    pub fn read(&self, offset: u64, size: u32) -> Result<Vec<u8>, Errno> {
        let n = (self.len.saturating_sub(offset)).min(u64::from(size)) as usize;
        let mut buf = vec![0u8; n];
        self.file.read_exact_at(&mut buf, offset).map_err(|_| Errno::EIO)?;
        Ok(buf)
    }

    /// Uploads the spooled bytes as the new version of the object.
    pub fn publish(&mut self, fleet: &Fleet) -> Result<ObjectMeta, Errno> {
        match fleet.client().put_open_file(&self.url, &self.file) {
            Ok(meta) => {
                self.state = State::Published;
                Ok(meta)
            }
            Err(e) => {
                let errno = failed(&format!("upload of {}", self.url), &e);
                self.state = State::Failed(errno);
                Err(errno)
            }
        }
    }
}
