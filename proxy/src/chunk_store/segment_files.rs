//! The files of a slot's segments (`memarts_disk::segment` has their bytes): the slot's directory
//! `v1/segments/<slot>/` and the lock that makes the slot its only writer, the segments found there
//! at start (each from its index file, or from its records where it has none: the segment that was
//! being written when the slot stopped, or was killed), index files written whole (temp file and
//! rename), and the directories of slots a smaller fleet no longer has.

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use memarts_disk::segment::{self, IndexEntry, SEGMENT_HEADER};

use crate::cache_root::DIR_MODE;

const FILE_MODE: u32 = 0o600;

/// `<dir>/<seq:016x>.seg`.
pub(super) fn segment_path(dir: &Path, seq: u32) -> PathBuf {
    dir.join(format!("{seq:016x}.seg"))
}

/// `<dir>/<seq:016x>.idx`.
pub(super) fn index_path(dir: &Path, seq: u32) -> PathBuf {
    dir.join(format!("{seq:016x}.idx"))
}

fn own(meta: &fs::Metadata) -> bool {
    meta.uid() == memarts_settings::dir_trust::own_uid()
}

/// The slot's directory under `segments` (created 0700), if it is a directory of ours.
pub(super) fn slot_dir(segments: &Path, slot: u32) -> io::Result<PathBuf> {
    let dir = segments.join(slot.to_string());
    match DirBuilder::new().mode(DIR_MODE).create(&dir) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
        _ => {}
    }
    let meta = fs::symlink_metadata(&dir)?;
    if !meta.is_dir() || !own(&meta) {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("{} is not a directory of ours", dir.display()),
        ));
    }
    Ok(dir)
}

/// The lock of the slot's directory, held: `None` if another process holds it (a slot of another
/// fleet on the same cache, an embedded engine), whose segments this one must not write.
pub(super) fn lock(dir: &Path) -> io::Result<Option<nix::fcntl::Flock<File>>> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .mode(FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(dir.join("lock"))?;
    match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
        Ok(locked) => Ok(Some(locked)),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => Ok(None),
        Err((_, e)) => Err(e.into()),
    }
}

/// Opens a segment file of ours for reading and appending, or only reading (another slot's), never
/// through a symlink.
pub(super) fn open_segment(path: &Path, create: bool, write: bool) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(write)
        .create_new(create)
        .mode(FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() || !own(&meta) {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "not a segment file of ours"));
    }
    Ok(file)
}

/// The segments in `dir` numbered below `below`, by number, each with its file and the records it holds: from its index
/// file if that is whole, else read from its records up to the first that fails a check (a torn
/// append). In the slot's own directory (`own`), such a segment is cut after its last whole record
/// and its index written, temp files are removed, and a segment that cannot be read is removed;
/// another slot's directory is only read.
pub(super) fn load(dir: &Path, own: bool, below: u32) -> io::Result<Vec<(u32, File, Vec<IndexEntry>)>> {
    let mut seqs = Vec::new();
    for entry in fs::read_dir(dir)? {
        let name = entry?.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.ends_with(".tmp") && own {
            let _ = fs::remove_file(dir.join(name));
        } else if let Some(seq) = name.strip_suffix(".seg").and_then(|h| u32::from_str_radix(h, 16).ok()) {
            if seq < below {
                seqs.push(seq);
            }
        }
    }
    seqs.sort_unstable();
    let mut out = Vec::with_capacity(seqs.len());
    for seq in seqs {
        let path = segment_path(dir, seq);
        let loaded = open_segment(&path, false, own).and_then(|file| {
            let entries = match read_index(dir, seq) {
                Some(entries) => entries,
                None => {
                    let entries = read_records(&file, seq, own)?;
                    if own {
                        write_index(dir, seq, &entries)?;
                    }
                    entries
                }
            };
            // Never appended to again (a new process starts a segment of its own): read-only.
            let file = if own { open_segment(&path, false, false)? } else { file };
            Ok((file, entries))
        });
        match loaded {
            Ok((file, entries)) => out.push((seq, file, entries)),
            Err(e) if own => {
                tracing::warn!("removing segment {}: {e}", path.display());
                let _ = fs::remove_file(&path);
                let _ = fs::remove_file(index_path(dir, seq));
            }
            Err(_) => {} // gone meanwhile (its slot compacted it), or not readable: nothing to take
        }
    }
    Ok(out)
}

/// The records of the segment `seq` (its `file`), live or dead: from its index, else read from its
/// records up to the first that fails a check.
pub(super) fn records(dir: &Path, seq: u32, file: &File) -> io::Result<Vec<IndexEntry>> {
    match read_index(dir, seq) {
        Some(entries) => Ok(entries),
        None => read_records(file, seq, false),
    }
}

/// The index of segment `seq`, if it is whole.
fn read_index(dir: &Path, seq: u32) -> Option<Vec<IndexEntry>> {
    segment::decode_index(&fs::read(index_path(dir, seq)).ok()?).ok()
}

/// The first segment written by the slot as one of a fleet of how many slots (`since`), and whether
/// the slot took its chunks from the other slots' segments as one of a fleet of how many
/// (`adopted`): small files of the slot's directory, `<fleet size> <segment>` and `<fleet size>`.
fn read_numbers(path: &Path) -> Option<Vec<u32>> {
    fs::read_to_string(path).ok()?.split_whitespace().map(|w| w.parse().ok()).collect()
}

fn write_numbers(dir: &Path, name: &str, numbers: &[u32]) -> io::Result<()> {
    let text: Vec<String> = numbers.iter().map(u32::to_string).collect();
    write_whole(dir, name, text.join(" ").as_bytes())
}

/// Writes `<dir>/<name>` whole (0600): a temp file renamed into place.
fn write_whole(dir: &Path, name: &str, bytes: &[u8]) -> io::Result<()> {
    let tmp = dir.join(format!("{name}.{}.tmp", std::process::id()));
    let written = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)
        .and_then(|f| f.write_all_at(bytes, 0))
        .and_then(|()| fs::rename(&tmp, dir.join(name)));
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    written
}

/// `(slots, seq)`: the directory's segments from `seq` on hold only chunks its slot owns in a
/// fleet of `slots` slots (those before, a fleet of another size's).
pub(super) fn since(dir: &Path) -> Option<(u32, u32)> {
    match read_numbers(&dir.join("since"))?[..] {
        [slots, seq] => Some((slots, seq)),
        _ => None,
    }
}

pub(super) fn set_since(dir: &Path, slots: u32, seq: u32) -> io::Result<()> {
    write_numbers(dir, "since", &[slots, seq])
}

/// The fleet size for which the directory's slot took its chunks from the others' segments.
pub(super) fn adopted(dir: &Path) -> Option<u32> {
    match read_numbers(&dir.join("adopted"))?[..] {
        [slots] => Some(slots),
        _ => None,
    }
}

pub(super) fn set_adopted(dir: &Path, slots: u32) -> io::Result<()> {
    write_numbers(dir, "adopted", &[slots])
}

/// The records of a segment read one after the other, by their heads; with `cut`, the file is cut
/// after the last whose head holds and that the file holds whole.
fn read_records(file: &File, seq: u32, cut: bool) -> io::Result<Vec<IndexEntry>> {
    let len = file.metadata()?.len();
    let mut bytes = vec![0u8; usize::try_from(len).map_err(|_| io::Error::from(io::ErrorKind::InvalidData))?];
    file.read_exact_at(&mut bytes, 0)?;
    if !segment::is_segment_header(&bytes, u64::from(seq)) {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "no segment header"));
    }
    let mut entries = Vec::new();
    let mut at = SEGMENT_HEADER as usize;
    // Records are walked by their heads (magic, bounds, head CRC); their data is checked when
    // read, as a sealed segment's are: a damaged record in the middle is then caught, counted and
    // refetched, and the records after it are kept. Only a head that does not hold, or a record
    // past the end of the file, ends the walk: a torn append.
    while let Ok(head) = segment::decode_head(&bytes[at..]) {
        if at as u64 + head.record_len() > len {
            break; // its data or padding was never written: torn
        }
        let id = memarts_disk::chunk_file::ChunkKey::decode_identity(head.identity).map(|k| k.id().0);
        let Some(id) = id else { break };
        entries.push(IndexEntry { id, offset: at as u32, record_len: head.record_len() as u32 });
        at += head.record_len() as usize;
    }
    if (at as u64) < len && cut {
        tracing::warn!(
            seq,
            kept = entries.len(),
            cut = len - at as u64,
            "segment cut after its last whole record"
        );
        file.set_len(at as u64)?;
    }
    Ok(entries)
}

/// Writes the index of segment `seq` whole: a temp file renamed into place.
pub(super) fn write_index(dir: &Path, seq: u32, entries: &[IndexEntry]) -> io::Result<()> {
    write_whole(dir, &format!("{seq:016x}.idx"), &segment::encode_index(entries))
}

/// Removes the segment `seq` (its file and its index).
pub(super) fn remove(dir: &Path, seq: u32) {
    for path in [segment_path(dir, seq), index_path(dir, seq)] {
        match fs::remove_file(&path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                tracing::warn!("could not remove {}: {e}", path.display());
            }
            _ => {}
        }
    }
}

/// The numbered directories under `segments` (the slots' own), with their numbers.
pub(super) fn slot_dirs(segments: &Path) -> Vec<(u32, PathBuf)> {
    let Ok(dirs) = fs::read_dir(segments) else { return Vec::new() };
    dirs.flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.parse::<u32>().ok()?, e.path())))
        .filter(|(_, path)| fs::symlink_metadata(path).is_ok_and(|m| m.is_dir() && own(&m)))
        .collect()
}

/// Removes the segment directories of slots `slots` and above (a fleet restarted with fewer slots),
/// once every slot of the fleet took its chunks from them. Not one whose lock a process holds.
pub(super) fn remove_orphans(segments: &Path, slots: u32) {
    for (n, path) in slot_dirs(segments) {
        if n < slots {
            continue;
        }
        if let Ok(Some(_held)) = lock(&path) {
            tracing::info!("removing the segments of slot {n}, which this fleet no longer has");
            if let Err(e) = fs::remove_dir_all(&path) {
                tracing::warn!("could not remove {}: {e}", path.display());
            }
        }
    }
}
