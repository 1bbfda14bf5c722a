//! Short strings (the names of the metadata cache's URLs, the keys of listed versions) held end to
//! end in one buffer, each behind a varint of its length, and named by a `u32` offset: 4 bytes in
//! the entry and 1-2 beside the string, where a `Box<str>` would cost 16 in the entry and the
//! allocator's rounding beside it.
//!
//! A string that is freed leaves a hole; once holes are a quarter of the buffer, the owner calls
//! [`ByteArena::compact`] with the offsets it still holds. The buffer grows by a sixteenth at a
//! time, so that its spare room stays a sixteenth of what it holds (doubling would leave up to as
//! much as it holds spare; a large buffer's `realloc` moves pages, not bytes). Offsets are `u32`: an arena holds at most 4 GiB ([`ByteArena::push`] refuses
//! more).

/// Holes below this many bytes are not worth a compaction.
const MIN_GARBAGE: usize = 4 << 10;

#[derive(Default, Debug)]
pub struct ByteArena {
    bytes: Vec<u8>,
    /// Bytes of freed strings (their lengths included).
    garbage: usize,
}

impl ByteArena {
    /// Holds `s`; `None` when the arena has no offset for it.
    pub fn push(&mut self, s: &[u8]) -> Option<u32> {
        let at = u32::try_from(self.bytes.len()).ok()?;
        let need = varint_len(s.len()) + s.len();
        if u32::try_from(self.bytes.len() + need).is_err() {
            return None;
        }
        if self.bytes.capacity() - self.bytes.len() < need {
            self.bytes.reserve_exact(need.max(self.bytes.len() / 16).max(64));
        }
        let mut len = s.len();
        while len >= 0x80 {
            self.bytes.push(len as u8 | 0x80);
            len >>= 7;
        }
        self.bytes.push(len as u8);
        self.bytes.extend_from_slice(s);
        Some(at)
    }

    /// The string at `at` (an offset [`ByteArena::push`] gave and that is not freed).
    pub fn get(&self, at: u32) -> &[u8] {
        let (start, len) = self.span(at);
        &self.bytes[start..start + len]
    }

    /// [`ByteArena::get`] as the `str` it was pushed as.
    pub fn get_str(&self, at: u32) -> &str {
        std::str::from_utf8(self.get(at)).expect("an arena holds what was pushed: str")
    }

    fn span(&self, at: u32) -> (usize, usize) {
        let (mut i, mut len, mut shift) = (at as usize, 0usize, 0);
        loop {
            let b = self.bytes[i];
            len |= ((b & 0x7f) as usize) << shift;
            i += 1;
            if b < 0x80 {
                return (i, len);
            }
            shift += 7;
        }
    }

    /// The string at `at` is no longer held.
    pub fn free(&mut self, at: u32) {
        let (start, len) = self.span(at);
        self.garbage += start - at as usize + len;
    }

    /// Whether holes are a quarter of the buffer: time for [`ByteArena::compact`].
    pub fn wants_compaction(&self) -> bool {
        self.garbage > MIN_GARBAGE && self.garbage * 4 > self.bytes.len()
    }

    /// Moves every string still held (`held`: their offsets, rewritten) into a buffer of their
    /// size, which holes no longer take room in.
    pub fn compact<'a>(&mut self, held: impl Iterator<Item = &'a mut u32>) {
        let live = self.bytes.len() - self.garbage;
        let mut next = ByteArena { bytes: Vec::with_capacity(live + live / 16), garbage: 0 };
        for at in held {
            *at = next.push(self.get(*at)).expect("fewer bytes than before");
        }
        *self = next;
    }

    #[cfg(test)]
    fn capacity(&self) -> usize {
        self.bytes.capacity()
    }
}

fn varint_len(mut len: usize) -> usize {
    let mut n = 1;
    while len >= 0x80 {
        len >>= 7;
        n += 1;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_of_any_length_come_back_and_survive_a_compaction() {
        let mut arena = ByteArena::default();
        let strings: Vec<String> = (0..3000).map(|i| "x".repeat(i % 300) + &i.to_string()).collect();
        let mut held: Vec<(u32, &String)> =
            strings.iter().map(|s| (arena.push(s.as_bytes()).unwrap(), s)).collect();
        for (at, s) in &held {
            assert_eq!(arena.get_str(*at), s.as_str());
        }
        for (at, _) in held.iter().skip(1).step_by(2) {
            arena.free(*at);
        }
        assert!(arena.wants_compaction());
        let before = arena.capacity();
        let mut kept: Vec<(u32, &String)> = held.drain(..).step_by(2).collect();
        arena.compact(kept.iter_mut().map(|(at, _)| at));
        assert!(arena.capacity() < before * 3 / 4, "{} of {before}", arena.capacity());
        assert!(!arena.wants_compaction());
        for (at, s) in &kept {
            assert_eq!(arena.get_str(*at), s.as_str());
        }
    }
}
