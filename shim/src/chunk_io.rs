//! One chunk over one connection: `ReadChunk` and `ReadFirst` round trips, and taking a reply's
//! bytes (inline payload, or a passed descriptor read and checksummed) into the caller's room.

use std::fs::File;
use std::os::fd::OwnedFd;

use memarts_protocol::{ChunkBody, ChunkReply, ChunkRequest, FirstRequest, ObjectMeta, Request, Response};

use crate::answer::expect_answer;
use crate::conn::Conn;
use crate::error::{Error, Result};
use crate::room::{assume_filled, pread_exact, Room, Sink};

/// One chunk into `dst` (exactly the chunk's length). A descriptor-served chunk that fails its
/// checksum is asked for again with `recheck` (the slot drops its copy and refetches it).
pub fn read_chunk(conn: &mut Conn, req: &ChunkRequest, dst: &mut Room) -> Result<()> {
    let mut req = req.clone();
    loop {
        let reply = conn.call(&Request::ReadChunk(req.clone()))?;
        let c = expect_answer!(reply.response, "ReadChunk", Response::Chunk(c) => c)?;
        if receive_body(conn, &c, reply.fds.into_iter().next(), reply.payload_len, dst)? {
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

/// Metadata and chunk 0 of `url` in one round trip: once the size is known, `sink` is asked for room
/// for the whole object and chunk 0 is written at its start. Also says whether chunk 0 came from
/// the cache.
pub fn read_first(
    conn: &mut Conn,
    url: &str,
    chunk_size: u64,
    refresh: bool,
    sink: &mut dyn Sink,
) -> Result<(ObjectMeta, bool)> {
    let request = FirstRequest { url: url.to_string(), chunk_size, refresh };
    let reply = conn.call(&Request::ReadFirst(request))?;
    let (meta, chunk) =
        expect_answer!(reply.response, "ReadFirst", Response::First { meta, chunk } => (meta, chunk))?;
    let size = usize::try_from(meta.size).map_err(|_| Error::BadRequest("object too large".into()))?;
    sink.reserve(size)?;
    let Some(c) = chunk else { return Ok((meta, true)) };
    let first = &mut sink.room()[..size.min(chunk_size as usize)];
    if !receive_body(conn, &c, reply.fds.into_iter().next(), reply.payload_len, first)? {
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
    Ok((meta, c.from_cache))
}

/// A memarts-only object into `sink` (sized when the reply arrives). Its bytes are checked; damage
/// is `Corrupt`, since the cache holds the only copy.
pub fn read_memarts(conn: &mut Conn, url: &str, sink: &mut dyn Sink) -> Result<u64> {
    let reply = conn.call(&Request::ReadMemarts { url: url.to_string() })?;
    let c = expect_answer!(reply.response, "ReadMemarts", Response::Chunk(c) => c)?;
    let size = usize::try_from(c.len).map_err(|_| Error::BadRequest("object too large".into()))?;
    sink.reserve(size)?;
    if !receive_body(conn, &c, reply.fds.into_iter().next(), reply.payload_len, sink.room())? {
        return Err(Error::Corrupt(format!("memarts-only object {url} failed its checksum")));
    }
    Ok(c.len)
}

/// Takes a chunk reply's bytes into `dst`: the inline payload, or the passed descriptor's bytes,
/// checksummed. Returns false when descriptor-served bytes fail their checksum.
fn receive_body(
    conn: &mut Conn,
    c: &ChunkReply,
    fd: Option<OwnedFd>,
    payload_len: u32,
    dst: &mut Room,
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
            fd_body_ok(&File::from(fd), offset, c.crc32c, dst)
        }
    }
}

/// Whether the bytes at `offset` of a passed chunk file, read into `dst`, match `crc32c`. A read
/// that fails (EIO from the disk, a file cut short under us) counts as a failed check like wrong
/// bytes do, so the chunk is asked for again with `recheck` and the slot refetches it, instead of
/// the read failing with an I/O error.
fn fd_body_ok(file: &File, offset: u64, crc32c: u32, dst: &mut Room) -> Result<bool> {
    match read_checked(file, dst, offset) {
        Ok(crc) => Ok(crc == crc32c),
        Err(Error::Io(_)) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Bytes read and checksummed per step: small enough that the checksum reads them from the CPU
/// cache right after the kernel copied them there, instead of from memory a second time.
const CHECK_PIECE: usize = 128 << 10;

/// Fills `dst` from `file` at `offset` and returns the CRC32C of what was read.
fn read_checked(file: &File, dst: &mut Room, offset: u64) -> Result<u32> {
    let mut crc = memarts_protocol::Crc32c::default();
    let mut at = offset;
    for piece in dst.chunks_mut(CHECK_PIECE) {
        pread_exact(file, piece, at)?;
        // SAFETY: pread_exact returned Ok, so it wrote every byte of `piece`.
        crc.update(unsafe { assume_filled(piece) });
        at += piece.len() as u64;
    }
    Ok(crc.finish())
}

/// Several chunks owned by one slot in one round trip; `dsts[i]` receives chunk `reqs[i]` (exactly
/// its length). Chunks whose descriptor-served bytes fail their checksum are asked for again, one by
/// one, with `recheck`.
pub fn read_batch(conn: &mut Conn, reqs: &[ChunkRequest], dsts: &mut [&mut Room]) -> Result<()> {
    let reply = conn.call(&Request::ReadChunks(reqs.to_vec()))?;
    let results = expect_answer!(reply.response, "ReadChunks", Response::Chunks(results) => results)?;
    if results.len() != reqs.len() {
        return Err(Error::Protocol(format!("{} results for {} chunks", results.len(), reqs.len())));
    }
    let inline: u64 = results
        .iter()
        .filter_map(|r| r.as_ref().ok())
        .filter(|c| c.body == ChunkBody::Inline)
        .map(|c| c.len)
        .sum();
    if inline != u64::from(reply.payload_len) {
        return Err(Error::Protocol("batch payload length differs from its inline chunks".into()));
    }
    let mut fds = reply.fds.into_iter();
    let mut failed = None;
    let mut recheck = Vec::new();
    for (i, result) in results.into_iter().enumerate() {
        match result {
            Ok(c) => {
                let fd = if c.body == ChunkBody::Inline { None } else { fds.next() };
                if !receive_body(conn, &c, fd, c.len as u32, dsts[i])? {
                    recheck.push(i);
                }
            }
            // The other chunks' bytes are still taken off the socket, so the connection stays usable.
            Err(e) => {
                failed.get_or_insert(e);
            }
        }
    }
    if let Some(e) = failed {
        return Err(e.into());
    }
    for i in recheck {
        let req = ChunkRequest { recheck: true, ..reqs[i].clone() };
        read_chunk(conn, &req, dsts[i])?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_passed_file_cut_short_is_a_failed_check_not_an_error() {
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(&data).unwrap();
        let crc = memarts_protocol::crc32c(&data[100..]);
        let mut buf = vec![0u8; data.len() - 100];
        assert!(fd_body_ok(&file, 100, crc, crate::room::as_room(&mut buf)).unwrap());
        assert!(buf == data[100..]);
        assert!(!fd_body_ok(&file, 100, crc ^ 1, crate::room::as_room(&mut buf)).unwrap());
        file.set_len(1000).unwrap();
        assert!(!fd_body_ok(&file, 100, crc, crate::room::as_room(&mut buf)).unwrap(), "a short file");
    }
}
