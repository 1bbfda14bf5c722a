//! The metadata cache's entries (`meta_cache.rs`): URL → packed metadata and when it was verified,
//! in least-recently-used order, bounded in entries, in ~48 bytes an entry plus its URL's last
//! path component (an `LruCache<String, (ObjectMeta, Instant)>` took ~300).
//!
//! - Entries are fixed-size [`Node`]s in one `Vec` (a slab: freed ones reused through a free
//!   list), linked into the LRU order by `u32` indices.
//! - A `hashbrown::HashTable<u32>` of node indices finds a URL's node: 4 bytes and a control byte
//!   a bucket. It compares the URL itself, so two URLs never share an entry (no hash is trusted to
//!   be unique); a URL's hash is computed again from its parts when the table grows.
//! - A URL is held as its directory (everything up to its last `/`), interned with a count of the
//!   entries in it ([`Dirs`]), and its last component, in a [`ByteArena`]. A directory of a
//!   thousand objects costs its prefix once.
//! - The metadata is a [`PackedMeta`] (28 bytes: an MD5 ETag inline, anything else spilled).
//! - The verification time is a `u32` count of milliseconds ([`Clock`]) where an `Instant` takes 16.

use std::num::NonZeroUsize;
use std::time::{Duration, Instant};

use hashbrown::HashTable;
use memarts_protocol::ObjectMeta;
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

use super::byte_arena::ByteArena;
use super::compact_meta::{MetaRef, PackedMeta, Spills};
use super::verified_clock::{Clock, Stamp};
use memarts_disk::meta_table::Entry;

/// No node: the end of a list, or the `dir` of a free node.
const NONE: u32 = u32::MAX;

/// One entry (48 bytes; 4-byte aligned, so no padding).
#[derive(Clone, Copy)]
struct Node {
    /// The next more recently used entry (NONE: the most recent).
    prev: u32,
    /// The next less recently used entry (NONE: the least recent); in a free node, the next free.
    next: u32,
    /// The URL's directory in [`Dirs`]; NONE in a free node.
    dir: u32,
    /// The URL's last component in the names arena.
    name: u32,
    verified: Stamp,
    meta: PackedMeta,
}

/// The directories of the URLs held, each once, with how many entries are in it.
#[derive(Default)]
struct Dirs {
    held: Vec<(Box<str>, u32)>,
    free: Vec<u32>,
    index: HashTable<u32>,
}

impl Dirs {
    fn intern(&mut self, prefix: &str) -> u32 {
        let hash = xxh3_64(prefix.as_bytes());
        let held = &mut self.held;
        if let Some(&id) = self.index.find(hash, |&id| &*held[id as usize].0 == prefix) {
            held[id as usize].1 += 1;
            return id;
        }
        let id = match self.free.pop() {
            Some(id) => {
                held[id as usize] = (prefix.into(), 1);
                id
            }
            None => {
                held.push((prefix.into(), 1));
                (held.len() - 1) as u32
            }
        };
        self.index.insert_unique(hash, id, |&id| xxh3_64(held[id as usize].0.as_bytes()));
        id
    }

    fn prefix(&self, id: u32) -> &str {
        &self.held[id as usize].0
    }

    fn release(&mut self, id: u32) {
        let entry = &mut self.held[id as usize];
        entry.1 -= 1;
        if entry.1 == 0 {
            let hash = xxh3_64(entry.0.as_bytes());
            entry.0 = Box::default();
            self.index.find_entry(hash, |&j| j == id).expect("an interned directory is indexed").remove();
            self.free.push(id);
        }
    }
}

/// A URL's directory (up to and with its last `/`) and last component.
fn split(url: &str) -> (&str, &str) {
    url.split_at(url.rfind('/').map_or(0, |i| i + 1))
}

/// The hash a URL is found by, from its two parts.
fn url_hash(prefix: &str, name: &[u8]) -> u64 {
    xxh3_64_with_seed(name, xxh3_64(prefix.as_bytes()))
}

/// [`url_hash`] of the URL a node holds.
fn node_hash(dirs: &Dirs, names: &ByteArena, node: &Node) -> u64 {
    url_hash(dirs.prefix(node.dir), names.get(node.name))
}

pub struct UrlLru {
    nodes: Vec<Node>,
    /// The first free node (NONE: none; the slab grows).
    free: u32,
    index: HashTable<u32>,
    /// The most and the least recently used entries.
    head: u32,
    tail: u32,
    len: usize,
    cap: NonZeroUsize,
    dirs: Dirs,
    names: ByteArena,
    spills: Spills,
    clock: Clock,
}

/// One entry, as [`UrlLru::iter`] shows it.
pub struct Held<'a> {
    lru: &'a UrlLru,
    node: &'a Node,
}

impl Held<'_> {
    pub fn url(&self) -> String {
        self.lru.url_of(self.node)
    }

    /// The URL, written over what `url` held (no new string an entry).
    pub fn url_into(&self, url: &mut String) {
        url.clear();
        self.lru.push_url(self.node, url);
    }

    pub fn meta(&self) -> ObjectMeta {
        self.node.meta.meta(&self.lru.spills)
    }

    /// What the metadata table says of it, verified at `verified_ms` (`PackedMeta::entry`).
    pub fn entry(&self, verified_ms: u64) -> Option<Entry> {
        self.node.meta.entry(&self.lru.spills, verified_ms)
    }

    /// How long before `now` it was verified.
    pub fn age(&self, now: Instant) -> Duration {
        self.lru.clock.age(self.node.verified, now)
    }
}

impl UrlLru {
    /// An empty map of at most `cap` entries, verified at most `ttl` before they are put (which
    /// sets the resolution of verification times: [`Clock`]).
    pub fn new(cap: NonZeroUsize, ttl: Duration) -> UrlLru {
        UrlLru {
            nodes: Vec::new(),
            free: NONE,
            index: HashTable::new(),
            head: NONE,
            tail: NONE,
            len: 0,
            cap,
            dirs: Dirs::default(),
            names: ByteArena::default(),
            spills: Spills::default(),
            clock: Clock::new(ttl),
        }
    }

    #[cfg(test)]
    pub fn cap(&self) -> NonZeroUsize {
        self.cap
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.len
    }

    fn url_of(&self, node: &Node) -> String {
        let mut url = String::new();
        self.push_url(node, &mut url);
        url
    }

    /// Appends the URL `node` holds to `url`.
    fn push_url(&self, node: &Node, url: &mut String) {
        url.push_str(self.dirs.prefix(node.dir));
        url.push_str(self.names.get_str(node.name));
    }

    fn find(&self, url: &str) -> Option<u32> {
        let (prefix, name) = split(url);
        let (nodes, dirs, names) = (&self.nodes, &self.dirs, &self.names);
        let is = |&i: &u32| {
            let n = &nodes[i as usize];
            names.get(n.name) == name.as_bytes() && dirs.prefix(n.dir) == prefix
        };
        self.index.find(url_hash(prefix, name.as_bytes()), is).copied()
    }

    /// Makes room for `more` entries (within the bound) at once: a load of many entries grows
    /// the index once, not through every doubling (each hashing every URL held again).
    pub fn reserve(&mut self, more: usize) {
        let more = more.min(self.cap.get().saturating_sub(self.len));
        if self.free == NONE {
            self.nodes.reserve_exact(more);
        }
        let (nodes, dirs, names) = (&self.nodes, &self.dirs, &self.names);
        self.index.reserve(more, |&j| node_hash(dirs, names, &nodes[j as usize]));
    }

    /// The metadata of `url` and how long ago it was verified, made the most recently used.
    pub fn get(&mut self, url: &str) -> Option<(ObjectMeta, Duration)> {
        let i = self.find(url)?;
        self.make_most_recent(i);
        let n = &self.nodes[i as usize];
        Some((n.meta.meta(&self.spills), self.clock.age(n.verified, Instant::now())))
    }

    /// [`UrlLru::get`] without making it the most recently used.
    pub fn peek(&self, url: &str) -> Option<(ObjectMeta, Duration)> {
        let n = &self.nodes[self.find(url)? as usize];
        Some((n.meta.meta(&self.spills), self.clock.age(n.verified, Instant::now())))
    }

    /// When the entry of `url` was verified, to compare with [`UrlLru::stamp`]s.
    pub fn verified(&self, url: &str) -> Option<Stamp> {
        self.find(url).map(|i| self.nodes[i as usize].verified)
    }

    /// `at` as entries' verification times are held (to the millisecond at best).
    pub fn stamp(&self, at: Instant) -> Stamp {
        self.clock.stamp(at)
    }

    /// Holds `meta` for `url`, verified `at`, as the most recently used entry: in place of the
    /// entry of `url` if any, else in place of the least recently used one at the bound. Not
    /// held if the names arena is full (4 GiB of names).
    pub fn put<'m>(&mut self, url: &str, meta: impl Into<MetaRef<'m>>, at: Instant) {
        self.put_where(url, meta.into(), at, |_, _| true);
    }

    /// [`UrlLru::put`], unless the entry of `url` was verified at `at` or later; whether it put.
    pub fn put_unless_newer(&mut self, url: &str, meta: MetaRef<'_>, at: Instant) -> bool {
        self.put_where(url, meta, at, |held, new| held < new)
    }

    /// [`UrlLru::put`] if `url` is not held, or if `replaces` (the held and the new verification
    /// times) says so; whether it put.
    fn put_where(
        &mut self,
        url: &str,
        meta: MetaRef<'_>,
        at: Instant,
        replaces: fn(Stamp, Stamp) -> bool,
    ) -> bool {
        if let Some(shift) = self.clock.rebase(Instant::now()) {
            for n in self.nodes.iter_mut().filter(|n| n.dir != NONE) {
                n.verified = n.verified.earlier_by(shift);
            }
        }
        let verified = self.clock.stamp(at);
        if let Some(i) = self.find(url) {
            let n = &mut self.nodes[i as usize];
            if !replaces(n.verified, verified) {
                return false;
            }
            n.meta.release(&mut self.spills);
            n.meta = PackedMeta::new(meta, &mut self.spills);
            n.verified = verified;
            self.make_most_recent(i);
            return true;
        }
        if self.len >= self.cap.get() {
            self.remove(self.tail);
        }
        let (prefix, name) = split(url);
        let Some(name_at) = self.names.push(name.as_bytes()) else { return false };
        let node = Node {
            prev: NONE,
            next: NONE,
            dir: self.dirs.intern(prefix),
            name: name_at,
            verified,
            meta: PackedMeta::new(meta, &mut self.spills),
        };
        let i = match self.free {
            NONE => {
                if self.nodes.len() == self.nodes.capacity() {
                    // By a sixteenth (not double), and never past the bound: spare nodes cost 48 B.
                    let room = self.cap.get().saturating_sub(self.nodes.len()).max(1);
                    self.nodes.reserve_exact((self.nodes.len() / 16).max(16).min(room));
                }
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
            free => {
                self.free = self.nodes[free as usize].next;
                self.nodes[free as usize] = node;
                free
            }
        };
        let (nodes, dirs, names) = (&self.nodes, &self.dirs, &self.names);
        let rehash = |&j: &u32| node_hash(dirs, names, &nodes[j as usize]);
        self.index.insert_unique(url_hash(prefix, name.as_bytes()), i, rehash);
        self.len += 1;
        self.link_front(i);
        true
    }

    /// Drops the entry of `url`; whether there was one.
    pub fn pop(&mut self, url: &str) -> bool {
        match self.find(url) {
            Some(i) => {
                self.remove(i);
                true
            }
            None => false,
        }
    }

    fn remove(&mut self, i: u32) {
        self.unlink(i);
        let n = self.nodes[i as usize];
        let hash = node_hash(&self.dirs, &self.names, &n);
        self.index.find_entry(hash, |&j| j == i).expect("a held node is indexed").remove();
        self.names.free(n.name);
        self.dirs.release(n.dir);
        n.meta.release(&mut self.spills);
        self.nodes[i as usize] = Node { dir: NONE, next: self.free, ..n };
        self.free = i;
        self.len -= 1;
        if self.names.wants_compaction() {
            let held = self.nodes.iter_mut().filter(|n| n.dir != NONE).map(|n| &mut n.name);
            self.names.compact(held);
        }
    }

    fn unlink(&mut self, i: u32) {
        let Node { prev, next, .. } = self.nodes[i as usize];
        match prev {
            NONE => self.head = next,
            p => self.nodes[p as usize].next = next,
        }
        match next {
            NONE => self.tail = prev,
            n => self.nodes[n as usize].prev = prev,
        }
    }

    fn link_front(&mut self, i: u32) {
        let old = self.head;
        self.nodes[i as usize].prev = NONE;
        self.nodes[i as usize].next = old;
        match old {
            NONE => self.tail = i,
            o => self.nodes[o as usize].prev = i,
        }
        self.head = i;
    }

    fn make_most_recent(&mut self, i: u32) {
        if self.head != i {
            self.unlink(i);
            self.link_front(i);
        }
    }

    /// The entries, the most recently used first.
    pub fn iter(&self) -> impl Iterator<Item = Held<'_>> {
        self.walk(self.head, |n| n.next)
    }

    /// The entries, the least recently used first.
    pub fn iter_lru_first(&self) -> impl Iterator<Item = Held<'_>> {
        self.walk(self.tail, |n| n.prev)
    }

    fn walk(&self, first: u32, step: fn(&Node) -> u32) -> impl Iterator<Item = Held<'_>> {
        let node = |i: u32| (i != NONE).then(|| &self.nodes[i as usize]);
        std::iter::successors(node(first), move |n| node(step(n))).map(move |node| Held { lru: self, node })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(n: u64) -> ObjectMeta {
        ObjectMeta { size: n, etag: Some(format!("\"e{n}\"")), version: None, last_modified_ms: 0 }
    }

    /// Against a plain model: every URL found with its last metadata, in LRU order, within the
    /// bound, whatever is put, got and popped (directories shared and left, names compacted).
    #[test]
    fn behaves_as_an_lru_map_of_its_bound() {
        let cap = 300;
        let mut lru = UrlLru::new(NonZeroUsize::new(cap).unwrap(), Duration::from_secs(60));
        let mut model: Vec<(String, ObjectMeta)> = Vec::new(); // most recent last
        let now = Instant::now();
        let mut x = 12345u64;
        for step in 0..20_000u64 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let url = format!(
                "s3://b/d{}/{}",
                (x >> 40) % 7,
                "n".repeat(((x >> 20) % 40) as usize) + &((x >> 33) % 500).to_string()
            );
            let at = model.iter().position(|(u, _)| *u == url);
            match (x >> 60) % 4 {
                0 | 1 => {
                    lru.put(&url, &meta(step), now);
                    if let Some(p) = at {
                        model.remove(p);
                    } else if model.len() == cap {
                        model.remove(0);
                    }
                    model.push((url, meta(step)));
                }
                2 => {
                    assert_eq!(lru.get(&url).map(|(m, _)| m), at.map(|p| model[p].1.clone()));
                    if let Some(p) = at {
                        let e = model.remove(p);
                        model.push(e);
                    }
                }
                _ => {
                    assert_eq!(lru.pop(&url), at.is_some());
                    if let Some(p) = at {
                        model.remove(p);
                    }
                }
            }
            assert_eq!(lru.len(), model.len());
        }
        let held: Vec<(String, ObjectMeta)> = lru.iter_lru_first().map(|h| (h.url(), h.meta())).collect();
        assert_eq!(held, model);
        assert!(lru.iter().map(|h| h.url()).eq(model.iter().rev().map(|(u, _)| u.clone())));
    }

    #[test]
    fn urls_without_a_slash_or_a_name_are_held_too() {
        let mut lru = UrlLru::new(NonZeroUsize::new(4).unwrap(), Duration::from_secs(60));
        for url in ["a", "s3://b/dir/", "", "/"] {
            lru.put(url, &meta(1), Instant::now());
        }
        for url in ["a", "s3://b/dir/", "", "/"] {
            assert_eq!(lru.peek(url).map(|(m, _)| m), Some(meta(1)), "{url:?}");
        }
        assert_eq!(lru.peek("s3://b/dir"), None);
    }
}
