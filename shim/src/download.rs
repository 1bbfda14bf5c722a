//! Downloads: an object copied into a local file in bounded memory, by windows read (their chunks in
//! parallel) and written at their offset, large objects as several ranges at once, through a temp
//! file renamed into place; an object copied as one range goes through a [`Stream`] instead, so its
//! next chunks are in flight while one is written.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;

use memarts_protocol::ObjectMeta;

use crate::client::Client;
use crate::error::{Error, Result};
use crate::local_file::write_atomically;
use crate::stream::{Source, Stream};

impl Client {
    /// Copies the object `url` into the local file `path` (via a temp file renamed into place), in
    /// bounded memory: windows of the object are read (their chunks in parallel) and written at their
    /// offset. Objects of at least `large_threshold` bytes are split into `large_tasks` ranges copied
    /// at once (MoXing's `MOX_MEMARTS_LARGE_FILE_ACC`). Returns the size.
    pub fn download(&self, url: &str, path: &Path, large_tasks: usize, large_threshold: u64) -> Result<u64> {
        match self.download_head(url, path)? {
            Ok(size) => Ok(size),
            Err(meta) => self.download_at_meta(url, &meta, path, large_tasks, large_threshold),
        }
    }

    /// The first round trip of a download: the object's metadata and chunk 0 together, one GET when
    /// the object is cold (where a stat and then a read cost two), none for a warm object whose
    /// version its slot published (a local read, [`Client::read_head`]). An object of one chunk is written
    /// to `path` from it at once (`Ok(size)`); a larger one's version comes back (`Err(meta)`) for
    /// the caller's windowed or streamed copy, which finds chunk 0 cached.
    pub fn download_head(&self, url: &str, path: &Path) -> Result<std::result::Result<u64, ObjectMeta>> {
        // A larger object whose version is published: its whole copy reads chunk 0 directly anyway.
        if let Some(meta) = self.published_version(url)?.filter(|m| m.size > self.config().chunk_size) {
            return Ok(Err(meta));
        }
        let mut first = vec![0u8; self.config().chunk_size as usize];
        let meta = self.read_head(url, &mut first)?;
        if meta.size > self.config().chunk_size {
            return Ok(Err(meta));
        }
        let size = meta.size as usize;
        write_atomically(path, |tmp| -> Result<u64> {
            File::create(tmp)?.write_all(&first[..size])?;
            Ok(meta.size)
        })
        .map(Ok)
    }

    /// [`Client::download`] of the version `meta` names (e.g. from a local metadata cache).
    pub fn download_at_meta(
        &self,
        url: &str,
        meta: &ObjectMeta,
        path: &Path,
        large_tasks: usize,
        large_threshold: u64,
    ) -> Result<u64> {
        const WINDOW: u64 = 16 << 20;
        write_atomically(path, |tmp| -> Result<u64> {
            let file = File::create(tmp)?;
            file.set_len(meta.size)?;
            let tasks = if meta.size >= large_threshold { large_tasks.max(1) } else { 1 };
            let per_task = meta.size.div_ceil(tasks as u64).div_ceil(WINDOW) * WINDOW;
            let ranges: Vec<(u64, u64)> = (0..tasks as u64)
                .map(|i| (i * per_task, ((i + 1) * per_task).min(meta.size)))
                .filter(|(a, b)| a < b)
                .collect();
            let copy_range = |(start, end): (u64, u64)| -> Result<()> {
                let mut buf = vec![0u8; WINDOW.min(end - start) as usize];
                let mut offset = start;
                while offset < end {
                    let n = ((end - offset) as usize).min(buf.len());
                    let got = self.read_at(url, meta, offset, &mut buf[..n])?;
                    if got != n {
                        return Err(Error::Origin(format!(
                            "{url}: object ended at {} of {}",
                            offset + got as u64,
                            meta.size
                        )));
                    }
                    file.write_all_at(&buf[..n], offset)?;
                    offset += n as u64;
                }
                Ok(())
            };
            std::thread::scope(|s| {
                let handles: Vec<_> = ranges.into_iter().map(|r| s.spawn(move || copy_range(r))).collect();
                handles.into_iter().try_for_each(|h| {
                    h.join().unwrap_or_else(|_| Err(Error::Internal("copy thread panicked".into())))
                })
            })?;
            Ok(meta.size)
        })
    }
}

/// [`Client::download_at_meta`] of one range, through a [`Stream`]: the chunks after the one being
/// written are in flight meanwhile (the read-ahead window), where the windows of `download_at_meta`
/// each wait for their chunks before the next starts. For objects copied as one range.
pub fn download_streamed(source: Source, url: &str, meta: &ObjectMeta, path: &Path) -> Result<u64> {
    let chunk = (*source).as_ref().config().chunk_size.max(1);
    let mut stream = Stream::at_version(source, url, meta.clone())?;
    write_atomically(path, |tmp| -> Result<u64> {
        let mut file = File::create(tmp)?;
        let mut buf = vec![0u8; chunk.min(meta.size) as usize];
        while stream.position() < meta.size {
            let n = stream.read(&mut buf[..])?;
            if n == 0 {
                return Err(Error::Origin(format!(
                    "{url}: object ended at {} of {}",
                    stream.position(),
                    meta.size
                )));
            }
            file.write_all(&buf[..n])?;
        }
        Ok(meta.size)
    })
}
