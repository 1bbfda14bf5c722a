//! Reading objects: split a byte range into chunks, fetch them from their owning slots in parallel
//! (at most `MOX_COPY_PARALLEL_THREADS` at once), each straight into its place in the caller's buffer.
//!
//! A chunk served from the cache arrives as a file descriptor: the shim reads the bytes from the page
//! cache itself and checks their CRC32C; on a mismatch it asks the slot to drop and refetch the chunk.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Mutex;
use std::time::Instant;

use memarts_protocol::{
    chunk_owner, ChunkBody, ChunkReply, ChunkRequest, FirstRequest, ObjectMeta, ObjectUrl, Request, Response,
};

use crate::client::{parse, Client};
use crate::conn::Conn;
use crate::error::{Error, Result};

/// One chunk's share of a read: the chunk, and where its wanted bytes go.
struct Piece<'a> {
    index: u64,
    /// Offset of the wanted bytes within the chunk.
    skip: usize,
    dst: &'a mut [u8],
}

/// What one read is about: the object version pinned by its ETag.
struct Target<'a> {
    url: &'a ObjectUrl,
    url_text: String,
    etag: &'a str,
    size: u64,
    chunk_size: u64,
}

impl Client {
    /// The whole object.
    /// The whole object. Metadata and the first chunk come in one round trip from the owner of
    /// chunk 0; the other chunks follow in parallel, pinned to the ETag that round trip returned.
    pub fn read(&self, url: &str) -> Result<Vec<u8>> {
        let parsed = parse(url)?;
        let url_text = parsed.to_string();
        let cs = self.cfg.chunk_size;
        let slot = chunk_owner(&parsed, cs, 0, self.slots());
        let deadline = Instant::now() + self.cfg.deadline;
        let mut out = Vec::new();
        let meta = self.with_slot(slot, deadline, |conn| read_first(conn, &url_text, cs, &mut out))?;
        if meta.size > cs {
            self.read_at_meta(&url_text, &meta, cs, &mut out[cs as usize..])?;
        }
        Ok(out)
    }

    /// `len` bytes from `offset` (fewer at the end of the object).
    pub fn read_range(&self, url: &str, offset: u64, len: usize) -> Result<Vec<u8>> {
        let meta = self.stat(url)?;
        let len = len.min(meta.size.saturating_sub(offset) as usize);
        let mut buf = vec![0u8; len];
        let n = self.read_at_meta(url, &meta, offset, &mut buf)?;
        buf.truncate(n);
        Ok(buf)
    }

    /// Fills `dst` from `offset`; returns the bytes read (short only at the end of the object).
    pub fn read_into(&self, url: &str, offset: u64, dst: &mut [u8]) -> Result<usize> {
        let meta = self.stat(url)?;
        self.read_at_meta(url, &meta, offset, dst)
    }

    /// Reads with metadata the caller already has (its ETag pins the version read).
    pub fn read_at_meta(&self, url: &str, meta: &ObjectMeta, offset: u64, dst: &mut [u8]) -> Result<usize> {
        let parsed = parse(url)?;
        let etag = meta.etag.as_deref().filter(|e| !e.is_empty()).ok_or_else(|| {
            Error::Origin(format!("{url}: the origin reports no ETag, so its chunks cannot be cached safely"))
        })?;
        if offset >= meta.size || dst.is_empty() {
            return Ok(0);
        }
        let len = (meta.size - offset).min(dst.len() as u64) as usize;
        let target = Target {
            url: &parsed,
            url_text: parsed.to_string(),
            etag,
            size: meta.size,
            chunk_size: self.cfg.chunk_size,
        };
        let pieces = plan(&target, offset, &mut dst[..len]);
        let deadline = Instant::now() + self.cfg.deadline;
        let workers = self.cfg.parallel.min(pieces.len());
        if workers <= 1 {
            for piece in pieces {
                self.fetch_piece(&target, piece, deadline)?;
            }
            return Ok(len);
        }
        let queue = Mutex::new(pieces);
        let failure: Mutex<Option<Error>> = Mutex::new(None);
        std::thread::scope(|s| {
            for _ in 0..workers {
                s.spawn(|| loop {
                    if failure.lock().unwrap_or_else(|p| p.into_inner()).is_some() {
                        return;
                    }
                    let Some(piece) = queue.lock().unwrap_or_else(|p| p.into_inner()).pop() else { return };
                    if let Err(e) = self.fetch_piece(&target, piece, deadline) {
                        failure.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(e);
                        return;
                    }
                });
            }
        });
        match failure.into_inner().unwrap_or_else(|p| p.into_inner()) {
            Some(e) => Err(e),
            None => Ok(len),
        }
    }

    fn fetch_piece(&self, t: &Target<'_>, piece: Piece<'_>, deadline: Instant) -> Result<()> {
        let start = piece.index * t.chunk_size;
        let chunk_len = (t.size - start).min(t.chunk_size) as usize;
        let slot = chunk_owner(t.url, t.chunk_size, piece.index, self.slots());
        let req = ChunkRequest {
            url: t.url_text.clone(),
            etag: t.etag.to_string(),
            object_size: t.size,
            chunk_size: t.chunk_size,
            index: piece.index,
            recheck: false,
        };
        if piece.skip == 0 && piece.dst.len() == chunk_len {
            return self.with_slot(slot, deadline, |conn| read_chunk(conn, &req, piece.dst));
        }
        let mut whole = vec![0u8; chunk_len];
        self.with_slot(slot, deadline, |conn| read_chunk(conn, &req, &mut whole))?;
        piece.dst.copy_from_slice(&whole[piece.skip..piece.skip + piece.dst.len()]);
        Ok(())
    }
}

/// Cuts `dst` (the bytes from `offset`) into per-chunk pieces, last chunk first (workers pop them).
fn plan<'a>(t: &Target<'_>, offset: u64, mut dst: &'a mut [u8]) -> Vec<Piece<'a>> {
    let mut pieces = Vec::new();
    let mut pos = offset;
    while !dst.is_empty() {
        let index = pos / t.chunk_size;
        let skip = (pos - index * t.chunk_size) as usize;
        let take = ((t.chunk_size as usize) - skip).min(dst.len());
        let (head, rest) = std::mem::take(&mut dst).split_at_mut(take);
        pieces.push(Piece { index, skip, dst: head });
        dst = rest;
        pos += take as u64;
    }
    pieces.reverse();
    pieces
}

/// One chunk into `dst` (exactly the chunk's length), over one connection.
fn read_chunk(conn: &mut Conn, req: &ChunkRequest, dst: &mut [u8]) -> Result<()> {
    let mut req = req.clone();
    loop {
        let reply = conn.call(&Request::ReadChunk(req.clone()))?;
        let c = match reply.response {
            Response::Chunk(c) => c,
            Response::Error(e) => return Err(e.into()),
            other => return Err(Error::Protocol(format!("unexpected answer to ReadChunk: {other:?}"))),
        };
        if receive_body(conn, &c, reply.fd, reply.payload_len, dst)? {
            return Ok(());
        }
        if req.recheck {
            return Err(Error::Corrupt(format!(
                "chunk {} of {} failed its checksum again after a refetch",
                req.index, req.url
            )));
        }
        req.recheck = true;
    }
}

/// Metadata and chunk 0 of `url` in one round trip; `out` becomes a buffer of the object's size
/// with chunk 0 filled in.
fn read_first(conn: &mut Conn, url: &str, chunk_size: u64, out: &mut Vec<u8>) -> Result<ObjectMeta> {
    let request = FirstRequest { url: url.to_string(), chunk_size, refresh: false };
    let reply = conn.call(&Request::ReadFirst(request))?;
    let (meta, chunk) = match reply.response {
        Response::First { meta, chunk } => (meta, chunk),
        Response::Error(e) => return Err(e.into()),
        other => return Err(Error::Protocol(format!("unexpected answer to ReadFirst: {other:?}"))),
    };
    let size = usize::try_from(meta.size).map_err(|_| Error::BadRequest("object too large".into()))?;
    *out = vec![0u8; size];
    let Some(c) = chunk else { return Ok(meta) };
    let first = &mut out[..size.min(chunk_size as usize)];
    if !receive_body(conn, &c, reply.fd, reply.payload_len, first)? {
        let req = ChunkRequest {
            url: url.to_string(),
            etag: meta.etag.clone().unwrap_or_default(),
            object_size: meta.size,
            chunk_size,
            index: 0,
            recheck: true,
        };
        read_chunk(conn, &req, first)?;
    }
    Ok(meta)
}

/// Takes a chunk reply's bytes into `dst`: the inline payload, or the passed descriptor's bytes,
/// checksummed. Returns false when descriptor-served bytes fail their checksum.
fn receive_body(
    conn: &mut Conn,
    c: &ChunkReply,
    fd: Option<std::os::fd::OwnedFd>,
    payload_len: u32,
    dst: &mut [u8],
) -> Result<bool> {
    if c.len != dst.len() as u64 {
        return Err(Error::Protocol(format!("chunk of {} bytes where {} were expected", c.len, dst.len())));
    }
    match c.body {
        ChunkBody::Inline => {
            if payload_len as usize != dst.len() {
                return Err(Error::Protocol("inline payload length differs from the chunk length".into()));
            }
            conn.read_payload(dst)?;
            Ok(true)
        }
        ChunkBody::Fd { offset } => {
            let fd = fd.ok_or_else(|| Error::Protocol("chunk reply without its descriptor".into()))?;
            Ok(read_checked(&File::from(fd), dst, offset)? == c.crc32c)
        }
    }
}

/// Bytes read and checksummed per step: small enough that the checksum reads them from the CPU
/// cache right after the kernel copied them there, instead of from memory a second time.
const CHECK_PIECE: usize = 128 << 10;

/// Fills `dst` from `file` at `offset` and returns the CRC32C of what was read.
fn read_checked(file: &File, dst: &mut [u8], offset: u64) -> Result<u32> {
    let mut crc = memarts_protocol::Crc32c::default();
    let mut at = offset;
    for piece in dst.chunks_mut(CHECK_PIECE) {
        file.read_exact_at(piece, at)?;
        crc.update(piece);
        at += piece.len() as u64;
    }
    Ok(crc.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_covers_the_range_exactly() {
        let url = ObjectUrl::parse("s3://b/k").unwrap();
        let t = Target { url: &url, url_text: url.to_string(), etag: "e", size: 100, chunk_size: 10 };
        let mut buf = vec![0u8; 35];
        let pieces = plan(&t, 7, &mut buf);
        let shape: Vec<(u64, usize, usize)> =
            pieces.iter().rev().map(|p| (p.index, p.skip, p.dst.len())).collect();
        assert_eq!(shape, vec![(0, 7, 3), (1, 0, 10), (2, 0, 10), (3, 0, 10), (4, 0, 2)]);
    }
}
