//! Writing objects at the origin through the fleet: a `PutStart`, the bytes in `PutData` frames,
//! and a `PutFinish` carrying the size and CRC32C of everything sent, which the proxy checks before
//! the new version becomes visible. A slot that fails mid-upload makes the whole upload start over
//! (the sources here can be read again), until the deadline.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Instant;

use memarts_protocol::{chunk_owner, meta_owner_slot, Crc32c, ObjectMeta, Request, Response};

use crate::answer::expect_answer;
use crate::client::{parse, Client};
use crate::conn::Conn;
use crate::error::{Error, Result};

/// Bytes per `PutData` frame.
const PIECE: usize = 8 << 20;

impl Client {
    /// Writes `data` as the new version of `url`.
    pub fn put_bytes(&self, url: &str, data: &[u8]) -> Result<ObjectMeta> {
        self.put_with(url, data.len() as u64, |offset, buf| {
            buf.copy_from_slice(&data[offset as usize..offset as usize + buf.len()]);
            Ok(())
        })
    }

    /// Writes `data` as the memarts-only object `url` (`write_memarts`): the cache holds the only
    /// copy; `Ok` means it is durable. No room is `Error::NoSpace`.
    pub fn put_memarts_bytes(&self, url: &str, data: &[u8]) -> Result<ObjectMeta> {
        let parsed = parse(url)?;
        let url = parsed.to_string();
        let slot = meta_owner_slot(&url, self.slots());
        let deadline = Instant::now() + self.cfg.deadline;
        let mut buf = vec![0u8; PIECE.min(data.len())];
        let read_at = |offset: u64, buf: &mut [u8]| {
            buf.copy_from_slice(&data[offset as usize..offset as usize + buf.len()]);
            Ok(())
        };
        let start = Request::PutMemartsStart { url: url.clone() };
        self.conns
            .with_slot(slot, deadline, |conn| upload(conn, &start, data.len() as u64, &read_at, &mut buf))
    }

    /// Writes the local file `path` as the new version of `url`.
    pub fn put_file(&self, url: &str, path: &Path) -> Result<ObjectMeta> {
        let file = File::open(path)?;
        let size = file.metadata()?.len();
        self.put_with(url, size, |offset, buf| file.read_exact_at(buf, offset))
    }

    /// Writes the bytes of the open file `file` (read from offset 0 to its current length, with
    /// positioned reads: its offset is left alone) as the new version of `url`. For a file that has
    /// no name to open again, such as an unnamed temp file (`memarts mount`'s write spool).
    pub fn put_open_file(&self, url: &str, file: &File) -> Result<ObjectMeta> {
        let size = file.metadata()?.len();
        self.put_with(url, size, |offset, buf| file.read_exact_at(buf, offset))
    }

    fn put_with(
        &self,
        url: &str,
        size: u64,
        read_at: impl Fn(u64, &mut [u8]) -> std::io::Result<()>,
    ) -> Result<ObjectMeta> {
        let parsed = parse(url)?;
        let url = parsed.to_string();
        let slot = meta_owner_slot(&url, self.slots());
        let deadline = Instant::now() + self.cfg.deadline;
        let mut buf = vec![0u8; PIECE.min(size as usize)];
        let start = Request::PutStart { url: url.clone() };
        let meta =
            self.conns.with_slot(slot, deadline, |conn| upload(conn, &start, size, &read_at, &mut buf))?;
        self.refresh_first_owner(&parsed, slot, deadline);
        Ok(meta)
    }
}

impl Client {
    /// Deletes `url` at the origin (absent objects included) and makes the slot that answers its
    /// reads forget its metadata.
    pub fn delete(&self, url: &str) -> Result<()> {
        let parsed = parse(url)?;
        let url = parsed.to_string();
        let slot = meta_owner_slot(&url, self.slots());
        let deadline = Instant::now() + self.cfg.deadline;
        self.conns.with_slot(slot, deadline, |conn| {
            let reply = conn.call(&Request::Delete { url: url.clone() })?;
            expect_answer!(reply.response, "Delete", Response::Deleted => ())
        })?;
        self.refresh_first_owner(&parsed, slot, deadline);
        Ok(())
    }

    /// Reads of an object start at the owner of its chunk 0: after a write or delete through
    /// `done_at`, make that slot revalidate its metadata now rather than at the end of its TTL.
    fn refresh_first_owner(&self, url: &memarts_protocol::ObjectUrl, done_at: u32, deadline: Instant) {
        let first = chunk_owner(url, self.cfg.chunk_size, 0, self.slots());
        if first != done_at {
            let text = url.to_string();
            let _ = self.conns.with_slot(first, deadline, |conn| {
                conn.call(&Request::Stat { url: text.clone(), refresh: true }).map(|_| ())
            });
        }
    }
}

fn expect_ack(reply: Response) -> Result<u64> {
    expect_answer!(reply, "an upload", Response::PutAck { received } => received)
}

fn upload(
    conn: &mut Conn,
    start: &Request,
    size: u64,
    read_at: &impl Fn(u64, &mut [u8]) -> std::io::Result<()>,
    buf: &mut [u8],
) -> Result<ObjectMeta> {
    expect_ack(conn.call(start)?.response)?;
    let mut crc = Crc32c::default();
    let mut offset = 0u64;
    while offset < size {
        let n = buf.len().min((size - offset) as usize);
        read_at(offset, &mut buf[..n])?;
        crc.update(&buf[..n]);
        let received = expect_ack(conn.call_with_payload(&Request::PutData, &buf[..n])?.response)?;
        offset += n as u64;
        if received != offset {
            return Err(Error::Protocol(format!(
                "the proxy holds {received} bytes of the upload, we sent {offset}"
            )));
        }
    }
    let reply = conn.call(&Request::PutFinish { size, crc32c: crc.finish() })?;
    expect_answer!(reply.response, "PutFinish", Response::Put(meta) => meta)
}
