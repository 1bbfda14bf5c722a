//! Entries of words guarded by a sequence number (a seqlock), shared by the tables a slot publishes
//! in mapped files (`meta_table`, `resident_table`): one writer, any number of readers in any process,
//! readers never block the writer and never see a torn entry. Word 0 of an entry is its sequence
//! number: 0 never written, odd while being written, even once written.

use std::sync::atomic::{fence, AtomicU64, Ordering};

/// Writes an entry under its sequence number: odd while the fields change, even again after.
pub(crate) fn write(entry: &[AtomicU64], fields: impl FnOnce(&[AtomicU64])) {
    let seq = entry[0].load(Ordering::Relaxed);
    let seq = seq + (seq & 1); // a writer that died mid-write left it odd: take it from there
    entry[0].store(seq + 1, Ordering::Relaxed);
    fence(Ordering::Release);
    fields(entry);
    entry[0].store(seq + 2, Ordering::Release);
}

/// What a consistent read of an entry found.
pub(crate) enum Read<T> {
    /// Never written.
    Never,
    /// `fields` of a copy no write changed while it was made, and the sequence number it was made
    /// at (the entry is unchanged while its sequence number is: [`unchanged`]).
    Holds(T, u64),
}

/// A consistent copy of an entry, made by `fields` (which must only load, `Relaxed`); `None` when a
/// writer kept changing it.
pub(crate) fn read<T>(entry: &[AtomicU64], fields: impl Fn(&[AtomicU64]) -> T) -> Option<Read<T>> {
    for _ in 0..16 {
        let before = entry[0].load(Ordering::Acquire);
        if before == 0 {
            return Some(Read::Never);
        }
        if before & 1 == 1 {
            std::hint::spin_loop();
            continue;
        }
        let copy = fields(entry);
        fence(Ordering::Acquire);
        if entry[0].load(Ordering::Relaxed) == before {
            return Some(Read::Holds(copy, before));
        }
    }
    None
}

/// Whether the entry is still as it was read at sequence number `seq` (no write since).
pub(crate) fn unchanged(entry: &[AtomicU64], seq: u64) -> bool {
    fence(Ordering::Acquire);
    entry[0].load(Ordering::Acquire) == seq
}
