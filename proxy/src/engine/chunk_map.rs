//! The chunks a slot's index holds, in recency order: for each, its bytes on disk and when it was
//! last read, and which placements (the chunk of an object, any version) some chunk holds. A node
//! caching tens of millions of small objects keeps one of these entries for each of them, so it is
//! packed: at most 48 bytes a chunk, where an `LruCache` and a map of placements took 135.
//!
//! Layout:
//! - the nodes, 32 bytes each (id, bytes, read time, and the previous and next node), in one
//!   vector, doubly linked by index from the most recently used (`head`) to the least (`tail`).
//!   Freed nodes are chained in a free list and reused; the vector grows by an eighth at a time
//!   (at most 36 bytes of nodes a chunk), and is compacted, in recency order, once less than half
//!   of it is used, so a slot that held many chunks and now holds few gives the memory back;
//! - a hash table of node indices: 4 bytes and a control byte a place, 44% to 87% full (it
//!   doubles), so 6 to 12 bytes a chunk. An id is hashed by its placement alone (its upper 64
//!   bits), so that every version of one chunk lies on one probe sequence: whether some version
//!   of a placement is held is one lookup, and no second table counts them.

use hashbrown::HashTable;

/// The end of a list.
const NIL: u32 = u32::MAX;

/// The vector grows by this fraction of its length when full, at least [`MIN_GROWTH`] nodes.
const GROWTH: usize = 8;
const MIN_GROWTH: usize = 64;

/// Vectors of at most this many nodes are never compacted: they give back little.
const MIN_COMPACTED: usize = 1024;

/// A cached chunk as the index and its policy see it: its bytes on disk, and the policy's read
/// clock's time when it was last read (or indexed), exact, unlike the clock's own table: a victim
/// that looked recently read because it shares the table's slots with chunks being read would hold
/// up every admission behind it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub bytes: u64,
    pub read_at: u32,
}

/// One chunk. Its bytes on disk fit in 32 bits: a chunk is at most 64 MiB (`MAX_CHUNK_SIZE`,
/// checked on every request) and its header.
#[derive(Clone, Copy)]
struct Node {
    id: u128,
    bytes: u32,
    read_at: u32,
    /// The next more recently used node (`NIL` for the most recent).
    prev: u32,
    /// The next less recently used node (`NIL` for the least recent); in the free list, the next
    /// free node.
    next: u32,
}

const _: () = assert!(std::mem::size_of::<Node>() == 32);

impl Node {
    fn entry(&self) -> Entry {
        Entry { bytes: u64::from(self.bytes), read_at: self.read_at }
    }
}

fn placement_of(id: u128) -> u64 {
    (id >> 64) as u64
}

/// The table's hash of a placement. Placements are hashes already; a folded multiply spreads
/// small ones too (tests', and any made by hand) over the table's places and control bytes.
fn hash_of(placement: u64) -> u64 {
    let m = u128::from(placement) * 0x9E37_79B9_7F4A_7C15;
    (m as u64) ^ ((m >> 64) as u64)
}

/// The chunks of an index, most recently used first (see the module's layout).
pub struct ChunkMap {
    nodes: Vec<Node>,
    table: HashTable<u32>,
    head: u32,
    tail: u32,
    /// The first free node in `nodes`, chained through their `next`.
    free: u32,
    len: usize,
}

impl Default for ChunkMap {
    fn default() -> Self {
        ChunkMap { nodes: Vec::new(), table: HashTable::new(), head: NIL, tail: NIL, free: NIL, len: 0 }
    }
}

impl ChunkMap {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn find(&self, id: u128) -> Option<u32> {
        let nodes = &self.nodes;
        self.table.find(hash_of(placement_of(id)), |&i| nodes[i as usize].id == id).copied()
    }

    /// `id`'s entry, without marking it used.
    pub fn peek(&self, id: u128) -> Option<Entry> {
        self.find(id).map(|i| self.nodes[i as usize].entry())
    }

    pub fn contains(&self, id: u128) -> bool {
        self.find(id).is_some()
    }

    /// Whether some chunk with this placement (some version of it) is held.
    pub fn contains_placement(&self, placement: u64) -> bool {
        let nodes = &self.nodes;
        self.table.find(hash_of(placement), |&i| placement_of(nodes[i as usize].id) == placement).is_some()
    }

    /// Makes room for `more` chunks at once (a rebuild's scan): the nodes and the table grow once,
    /// not an eighth and a doubling at a time.
    pub fn reserve(&mut self, more: usize) {
        self.nodes.reserve_exact(more);
        let nodes = &self.nodes;
        self.table.reserve(more, |&i| hash_of(placement_of(nodes[i as usize].id)));
    }

    /// Inserts `id`, or replaces its entry, as the most recently used; its previous entry, if any.
    pub fn put(&mut self, id: u128, bytes: u32, read_at: u32) -> Option<Entry> {
        if let Some(i) = self.find(id) {
            let node = &mut self.nodes[i as usize];
            let old = node.entry();
            (node.bytes, node.read_at) = (bytes, read_at);
            self.unlink(i);
            self.link_first(i);
            return Some(old);
        }
        let i = self.allocate(Node { id, bytes, read_at, prev: NIL, next: NIL });
        let nodes = &self.nodes;
        self.table
            .insert_unique(hash_of(placement_of(id)), i, |&j| hash_of(placement_of(nodes[j as usize].id)));
        self.link_first(i);
        self.len += 1;
        None
    }

    /// Marks `id` the most recently used, read at `read_at`; false if it is not held.
    pub fn promote(&mut self, id: u128, read_at: u32) -> bool {
        let Some(i) = self.find(id) else { return false };
        self.nodes[i as usize].read_at = read_at;
        self.unlink(i);
        self.link_first(i);
        true
    }

    /// Removes `id`; its entry, if it was held.
    pub fn pop(&mut self, id: u128) -> Option<Entry> {
        let nodes = &self.nodes;
        let found = self.table.find_entry(hash_of(placement_of(id)), |&i| nodes[i as usize].id == id);
        let (i, _) = found.ok()?.remove();
        Some(self.release(i).1)
    }

    /// Removes the least recently used chunk.
    pub fn pop_lru(&mut self) -> Option<(u128, Entry)> {
        let i = self.tail;
        if i == NIL {
            return None;
        }
        let hash = hash_of(placement_of(self.nodes[i as usize].id));
        let found = self.table.find_entry(hash, |&j| j == i);
        found.expect("every linked node is in the table").remove();
        Some(self.release(i))
    }

    /// The chunks, most recently used first (`.rev()`: least recently used first).
    pub fn iter(&self) -> Iter<'_> {
        Iter { nodes: &self.nodes, front: self.head, back: self.tail, left: self.len }
    }

    /// A node for `node`: a free one, or a new one at the end of the vector.
    fn allocate(&mut self, node: Node) -> u32 {
        if self.free != NIL {
            let i = self.free;
            self.free = self.nodes[i as usize].next;
            self.nodes[i as usize] = node;
            return i;
        }
        let i = u32::try_from(self.nodes.len()).ok().filter(|&i| i != NIL);
        let i = i.expect("a slot indexes fewer than 2^32 - 1 chunks");
        if self.nodes.len() == self.nodes.capacity() {
            self.nodes.reserve_exact((self.nodes.len() / GROWTH).max(MIN_GROWTH));
        }
        self.nodes.push(node);
        i
    }

    /// Unlinks node `i` (already out of the table) and frees it; its chunk.
    fn release(&mut self, i: u32) -> (u128, Entry) {
        self.unlink(i);
        let node = &mut self.nodes[i as usize];
        let held = (node.id, node.entry());
        node.next = self.free;
        self.free = i;
        self.len -= 1;
        if self.nodes.capacity() > MIN_COMPACTED && self.len < self.nodes.capacity() / 2 {
            self.compact();
        }
        held
    }

    fn unlink(&mut self, i: u32) {
        let Node { prev, next, .. } = self.nodes[i as usize];
        match prev {
            NIL => self.head = next,
            p => self.nodes[p as usize].next = next,
        }
        match next {
            NIL => self.tail = prev,
            n => self.nodes[n as usize].prev = prev,
        }
    }

    fn link_first(&mut self, i: u32) {
        let first = self.head;
        let node = &mut self.nodes[i as usize];
        (node.prev, node.next) = (NIL, first);
        match first {
            NIL => self.tail = i,
            f => self.nodes[f as usize].prev = i,
        }
        self.head = i;
    }

    /// Moves the chunks, in recency order, to a vector and a table sized for them (plus the
    /// vector's growth step), giving back what held the chunks removed.
    fn compact(&mut self) {
        let mut nodes = Vec::with_capacity(self.len + self.len / GROWTH);
        nodes.extend(self.iter_nodes());
        let last = nodes.len().wrapping_sub(1);
        for (k, node) in nodes.iter_mut().enumerate() {
            node.prev = if k == 0 { NIL } else { k as u32 - 1 };
            node.next = if k == last { NIL } else { k as u32 + 1 };
        }
        let mut table = HashTable::with_capacity(nodes.len());
        for (k, node) in nodes.iter().enumerate() {
            table.insert_unique(hash_of(placement_of(node.id)), k as u32, |&j| {
                hash_of(placement_of(nodes[j as usize].id))
            });
        }
        (self.head, self.tail) = if nodes.is_empty() { (NIL, NIL) } else { (0, last as u32) };
        (self.nodes, self.table, self.free) = (nodes, table, NIL);
    }

    fn iter_nodes(&self) -> impl Iterator<Item = Node> + '_ {
        std::iter::successors((self.head != NIL).then(|| self.nodes[self.head as usize]), |n| {
            (n.next != NIL).then(|| self.nodes[n.next as usize])
        })
    }
}

/// The chunks of a [`ChunkMap`] in recency order, from either end.
pub struct Iter<'a> {
    nodes: &'a [Node],
    front: u32,
    back: u32,
    left: usize,
}

impl Iterator for Iter<'_> {
    type Item = (u128, Entry);

    fn next(&mut self) -> Option<(u128, Entry)> {
        if self.left == 0 {
            return None;
        }
        let node = &self.nodes[self.front as usize];
        self.front = node.next;
        self.left -= 1;
        Some((node.id, node.entry()))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl DoubleEndedIterator for Iter<'_> {
    fn next_back(&mut self) -> Option<(u128, Entry)> {
        if self.left == 0 {
            return None;
        }
        let node = &self.nodes[self.back as usize];
        self.back = node.prev;
        self.left -= 1;
        Some((node.id, node.entry()))
    }
}

impl ExactSizeIterator for Iter<'_> {}

#[cfg(test)]
#[path = "chunk_map_tests.rs"]
mod tests;
