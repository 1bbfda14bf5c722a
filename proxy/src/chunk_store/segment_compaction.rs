//! Compaction of a slot's segments (`segments.rs`): once dead records take more than their room,
//! the segments with the most of them have their live records copied to the active segment (each
//! published at its new place before the old segment goes), then are removed (every entry still
//! naming them withdrawn first). A record found corrupt on the way is not copied: it is dropped and
//! handed back, for the slot to count and log as a read that found it would
//! (`DiskChunks::drop_corrupt`).

use std::io;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use memarts_disk::segment::{self, IndexEntry};

use super::{files, Loc, Segments, BLOCK};

impl Segments {
    /// Bytes on disk that hold no live record (dead records, and each file's last block).
    pub(super) fn dead(&self) -> u64 {
        let st = self.state();
        st.segs.keys().map(|&seq| st.dead_of(seq)).sum()
    }

    /// Compacts the segments with the most dead records while they take more than their room
    /// ([`Segments::reserved`]), at most a few at a time; the chunks whose records it found
    /// corrupt (dropped), and why. Blocking.
    pub fn reclaim(&self) -> Vec<(u128, String)> {
        let mut corrupt = Vec::new();
        if !self.settled() {
            return corrupt;
        }
        for _ in 0..4 {
            if self.dead() <= self.state().dead_room() || !self.compact_most_dead(&mut corrupt) {
                break;
            }
        }
        corrupt
    }

    /// Compacts the segment with the most dead records (the active one is sealed first if it is
    /// that one): false if none has any worth it, or while the fleet has not settled (another slot
    /// may still take chunks from them).
    fn compact_most_dead(&self, corrupt: &mut Vec<(u128, String)>) -> bool {
        if !self.settled() {
            return false;
        }
        let most = {
            let mut st = self.state();
            let most = st.segs.keys().copied().max_by_key(|&seq| st.dead_of(seq));
            // A segment's last blocks are never all full: only dead records are worth a copy.
            let Some(seq) = most.filter(|&seq| st.dead_of(seq) > 3 * BLOCK) else { return false };
            if st.active == Some(seq) {
                self.seal(&mut st, seq);
            }
            seq
        };
        match self.compact(most, corrupt) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(seq = most, "could not compact a segment: {e}");
                false
            }
        }
    }

    /// Moves the live records of the sealed segment `seq` to the active one, then removes it; a
    /// record found corrupt is dropped and added to `corrupt`.
    fn compact(&self, seq: u32, corrupt: &mut Vec<(u128, String)>) -> io::Result<()> {
        let (file, entries) = {
            let st = self.state();
            let Some(seg) = st.segs.get(&seq) else { return Ok(()) };
            (Arc::clone(&seg.file), files::records(&self.dir, seq, &seg.file)?)
        };
        let at_seq = |e: &IndexEntry| Loc { seq, offset: e.offset, len: e.record_len };
        let live: Vec<(u128, Loc)> = {
            let st = self.state();
            entries
                .iter()
                .filter(|e| st.locs.get(e.id) == Some(at_seq(e)))
                .map(|e| (e.id, at_seq(e)))
                .collect()
        };
        for (id, loc) in live {
            let mut bytes = vec![0u8; loc.len as usize];
            let checked = match file.read_exact_at(&mut bytes, u64::from(loc.offset)) {
                Ok(()) => segment::check_record(&bytes, None).map(drop).map_err(|e| e.to_string()),
                Err(e) => Err(format!("unreadable: {e}")),
            };
            let mut st = self.state();
            if st.locs.get(id) != Some(loc) {
                continue; // dropped or replaced meanwhile
            }
            if let Err(why) = checked {
                st.unplace(id);
                corrupt.push((id, format!("found by a compaction of segment {seq}: {why}")));
                continue;
            }
            if let Err(e) = self.append(&mut st, id, &bytes, false) {
                // What could not be moved is dropped with the segment: a miss, not an error.
                st.unplace(id);
                tracing::warn!("could not move a record out of segment {seq}: {e}");
            }
        }
        let mut st = self.state();
        // No shim may find a record of the segment once its file is gone.
        for e in &entries {
            if st.locs.get(e.id).is_some_and(|l| l.seq == seq) {
                st.unplace(e.id);
            }
        }
        st.segs.remove(&seq);
        st.counts.remove(&seq);
        st.changed();
        files::remove(&self.dir, seq);
        Ok(())
    }
}
