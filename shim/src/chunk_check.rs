//! The checks a chunk file passes before a client serves its bytes without a proxy (local hits,
//! `local_reads.rs`): the header must be this chunk's own (identity bytes and header CRC) and claim
//! exactly the length asked for, the data must match its CRC32C, unless the chunk's slot held it
//! resident (checked, locked in memory) from before the read until after it. The rules are the
//! proxy's too (`memarts_disk::chunk_file::verify`); the reads are this file's.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

use memarts_disk::chunk_file::{format, verify};
use memarts_disk::resident_table::{ResidentEntry, ResidentFile, ResidentTable, Stamp};
use memarts_protocol::ObjectUrl;

use crate::room::{assume_filled, pread_exact, preadv_exact, Room};

/// Data read and checksummed per step: small enough that the checksum reads it from the CPU cache
/// right after the kernel copied it there, large enough that a small file's data comes with its
/// header in one `preadv`.
const PIECE: usize = 512 << 10;

/// What a local read of one chunk found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Found {
    /// Read and checked: the bytes are in the caller's room.
    Served,
    /// No file (not cached, evicted, another node's chunk) or one that cannot be read: ask the slot.
    Absent,
    /// A file that failed its checks: ask the slot to drop and refetch it.
    Corrupt,
    /// Served from a chunk its slot held resident all through the read: checked when it was made
    /// resident, not again (reported to callers as `Served`).
    Resident,
}

/// The identity bytes of a chunk and its id (what names its file).
pub(crate) fn identity_of(url: &ObjectUrl, etag: &str, chunk_size: u64, index: u64) -> (Vec<u8>, u128) {
    let mut identity = Vec::with_capacity(64 + url.bucket.len() + url.key.len() + etag.len());
    memarts_protocol::encode_identity(&mut identity, url, etag, chunk_size, index);
    let id = memarts_protocol::chunk_id_from_identity(url, chunk_size, index, &identity);
    (identity, id)
}

/// Chunk `id`'s entry in a slot's resident table `resident`, if it is resident (with the table: its header is
/// checked once per read).
pub(crate) fn resident_of(
    resident: Option<&ResidentFile>,
    id: u128,
) -> Option<(ResidentTable<'_>, ResidentEntry)> {
    let table = resident?.table();
    table.lookup(id).map(|entry| (table, entry))
}

/// The chunk file mapped whole and locked in memory, if it is exactly this chunk's with `len`
/// bytes of data that match its CRC32C (the checks of [`check`], on the mapping), and whether it
/// was served as resident (`Found::Resident`) or checked (`Found::Served`).
///
/// With the chunk's `entry` (found before the file was opened), the CRC32C is not computed if, once
/// the mapping is locked, the file is still the one resident, unchanged, and the resident entry still holds
/// ([`resident_throughout`]): then the slot held these very pages locked, as it checked them, from
/// before the file was opened until this process locked them too, so no page could be dropped and
/// read again from the disk in between, and this process's lock keeps them while they are written
/// out.
pub(crate) fn map_checked(
    file: &File,
    identity: &[u8],
    len: usize,
    entry: Option<&(ResidentTable<'_>, ResidentEntry)>,
) -> Option<(memmap2::Mmap, Found)> {
    let data_offset = format::data_offset_for(identity.len());
    let whole = data_offset.checked_add(len as u64)?;
    // Never mapped past the end of the file: a page there would fault (SIGBUS) when read.
    if file.metadata().ok()?.len() < whole {
        return None;
    }
    // SAFETY: chunk files are written whole to a temp file and renamed into place; nothing writes
    // to or truncates a published one (an eviction unlinks it, which the mapping outlives), so the
    // mapped bytes do not change while the map lives. It is read only through `&[u8]`.
    let map = unsafe { memmap2::MmapOptions::new().len(whole as usize).map(file) }.ok()?;
    // Locked: the pages checked below stay the pages the caller writes out.
    map.lock().ok()?;
    let header = verify::header(&map[..data_offset as usize], identity).ok()?;
    verify::length(&header, len as u64).ok()?;
    let data = &map[data_offset as usize..];
    if let Some((table, entry)) = entry {
        if resident_throughout(file, table, entry) {
            return Some((map, Found::Resident));
        }
    }
    verify::data(&header, data).ok().map(|()| (map, Found::Served))
}

/// Reads the chunk's header and data from `file` into `dst` and checks both: the header must be this
/// chunk's (identity and header CRC) and claim exactly `dst.len()` bytes, the data must match its
/// CRC32C. The header and the first piece of data come in one `preadv`. With the chunk's `entry` (as
/// found before the file was opened), the data's CRC32C is not computed if the resident entry held all
/// through the read and the file read is the one resident, unchanged ([`resident_throughout`]).
pub(crate) fn check(
    file: &File,
    identity: &[u8],
    dst: &mut Room,
    entry: Option<&(ResidentTable<'_>, ResidentEntry)>,
) -> Found {
    let data_offset = format::data_offset_for(identity.len());
    // The usual header fits one page: on the stack, not zeroed.
    let mut page = [std::mem::MaybeUninit::<u8>::uninit(); format::ALIGN as usize];
    let mut long: Vec<u8> = Vec::new();
    let header: &mut Room = if data_offset <= format::ALIGN {
        &mut page[..data_offset as usize]
    } else {
        long.reserve_exact(data_offset as usize);
        &mut long.spare_capacity_mut()[..data_offset as usize]
    };
    let first = dst.len().min(PIECE);
    let (head, rest) = dst.split_at_mut(first);
    match preadv_exact(file.as_raw_fd(), header, head, 0) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Found::Corrupt,
        Err(_) => return Found::Absent,
    }
    // SAFETY: preadv_exact returned Ok, so every byte of `header` was written.
    let header = unsafe { assume_filled(header) };
    let header = match verify::header(header, identity) {
        Ok(header) if verify::length(&header, (first + rest.len()) as u64).is_ok() => header,
        _ => return Found::Corrupt,
    };
    let mut crc = entry.is_none().then(memarts_protocol::Crc32c::default);
    if let Some(crc) = crc.as_mut() {
        // SAFETY: preadv_exact returned Ok, so every byte of `head` was written.
        crc.update(unsafe { assume_filled(head) });
    }
    let mut at = data_offset + first as u64;
    for piece in rest.chunks_mut(PIECE) {
        match pread_exact(file, piece, at) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Found::Corrupt,
            Err(_) => return Found::Absent,
        }
        if let Some(crc) = crc.as_mut() {
            // SAFETY: pread_exact returned Ok, so every byte of `piece` was written.
            crc.update(unsafe { assume_filled(piece) });
        }
        at += piece.len() as u64;
    }
    let sum = match (crc, entry) {
        (Some(crc), _) => crc.finish(),
        (None, Some((table, entry))) if resident_throughout(file, table, entry) => return Found::Resident,
        // SAFETY: every piece of `dst` was read into above (each read returned Ok).
        (None, _) => memarts_protocol::crc32c(unsafe { assume_filled(dst) }),
    };
    match verify::data_crc(&header, sum) {
        Ok(()) => Found::Served,
        Err(_) => Found::Corrupt,
    }
}

/// Whether the bytes just read from `file` came from pages its slot held locked and checked all
/// through the read: the file is the one resident, unchanged since (inode, size, mtime and ctime as
/// noted: any write changes the last two), and the resident entry, found before the read, still holds (the
/// slot withdraws an entry before it unlocks, and a dead slot's resident chunks show as dead at once).
pub(crate) fn resident_throughout(file: &File, table: &ResidentTable<'_>, entry: &ResidentEntry) -> bool {
    file.metadata().is_ok_and(|m| Stamp::of(&m) == entry.stamp) && table.held(entry)
}
