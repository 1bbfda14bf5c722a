//! Tests of `chunk_map`.

use super::*;
use proptest::prelude::*;

/// Ids spread over 4 placements (the upper half), several versions each.
fn id(i: u8) -> u128 {
    (u128::from(i % 4) << 64) | u128::from(i)
}

/// Ids as the proxy makes them: a placement hash above a version hash.
fn hashed(i: u64) -> u128 {
    let h = |x: u64| xxhash_rust::xxh3::xxh3_64(&x.to_le_bytes());
    (u128::from(h(i)) << 64) | u128::from(h(!i))
}

fn order(map: &ChunkMap) -> Vec<(u128, Entry)> {
    map.iter().collect()
}

#[test]
fn chunks_come_most_recent_first_and_leave_least_recent_first() {
    let mut map = ChunkMap::default();
    for i in 0..4 {
        assert_eq!(map.put(id(i), 100 + u32::from(i), 7), None);
    }
    assert!(map.promote(id(1), 9));
    assert_eq!(map.put(id(2), 50, 10), Some(Entry { bytes: 102, read_at: 7 }));
    let ids: Vec<u128> = map.iter().map(|(id, _)| id).collect();
    assert_eq!(ids, [id(2), id(1), id(3), id(0)]);
    let back: Vec<u128> = map.iter().rev().map(|(id, _)| id).collect();
    assert_eq!(back, [id(0), id(3), id(1), id(2)]);
    assert_eq!(map.peek(id(1)), Some(Entry { bytes: 101, read_at: 9 }));
    assert_eq!(map.pop_lru(), Some((id(0), Entry { bytes: 100, read_at: 7 })));
    assert_eq!(map.pop(id(1)), Some(Entry { bytes: 101, read_at: 9 }));
    assert_eq!((map.pop(id(1)), map.len()), (None, 2));
    assert!(!map.promote(id(1), 11));
}

#[test]
fn a_placement_is_held_while_any_version_of_it_is() {
    let mut map = ChunkMap::default();
    let (v1, v2) = ((7u128 << 64) | 1, (7u128 << 64) | 2);
    map.put(v1, 1, 0);
    map.put(v2, 1, 0);
    map.put(8u128 << 64, 1, 0);
    map.pop(v1);
    assert!(map.contains_placement(7) && !map.contains(v1) && map.contains(v2));
    map.pop(v2);
    assert!(!map.contains_placement(7) && map.contains_placement(8));
}

#[test]
fn freed_nodes_are_reused_and_a_map_far_below_its_size_is_compacted() {
    let mut map = ChunkMap::default();
    for i in 0..10_000 {
        map.put(hashed(i), 1, 0);
    }
    let full = map.nodes.capacity();
    // Churn at a steady size reuses the nodes freed.
    for i in 10_000..50_000 {
        map.pop_lru();
        map.put(hashed(i), 1, 0);
    }
    assert_eq!(map.nodes.capacity(), full);
    // Most of them gone: the rest is moved to a vector (and table) their size, in recency order.
    for i in 40_000..49_000 {
        map.pop(hashed(i));
    }
    assert!(map.nodes.capacity() < full / 2, "{} of {full}", map.nodes.capacity());
    assert!(map.table.capacity() < 4 * map.len());
    let ids: Vec<u128> = map.iter().map(|(id, _)| id).collect();
    let expected: Vec<u128> = (49_000..50_000).rev().map(hashed).collect();
    assert_eq!(ids, expected);
    assert!(ids.iter().all(|&id| map.contains(id) && map.contains_placement((id >> 64) as u64)));
    // Drained least recent first, through more compactions, and usable again.
    let drained: Vec<u128> = std::iter::from_fn(|| map.pop_lru().map(|(id, _)| id)).collect();
    assert_eq!(drained, (49_000..50_000).map(hashed).collect::<Vec<_>>());
    assert_eq!((map.len(), map.iter().next()), (0, None));
    map.put(hashed(1), 1, 0);
    assert_eq!(map.iter().map(|(id, _)| id).collect::<Vec<_>>(), [hashed(1)]);
    assert!(map.nodes.capacity() <= MIN_COMPACTED);
}

#[derive(Debug, Clone)]
enum Op {
    Put(u8, u16, u16),
    Promote(u8, u16),
    Pop(u8),
    PopLru,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (any::<u8>(), any::<u16>(), any::<u16>()).prop_map(|(i, b, t)| Op::Put(i % 32, b, t)),
        2 => (any::<u8>(), any::<u16>()).prop_map(|(i, t)| Op::Promote(i % 32, t)),
        2 => any::<u8>().prop_map(|i| Op::Pop(i % 32)),
        1 => Just(Op::PopLru),
    ]
}

proptest! {
    /// Against the simplest correct model: a vector, most recent first.
    #[test]
    fn the_map_matches_a_vector_in_recency_order(ops in proptest::collection::vec(op(), 1..400)) {
        let mut map = ChunkMap::default();
        let mut model: Vec<(u128, Entry)> = Vec::new();
        for op in ops {
            match op {
                Op::Put(i, b, t) => {
                    let e = Entry { bytes: b.into(), read_at: t.into() };
                    let old = model.iter().position(|m| m.0 == id(i)).map(|p| model.remove(p).1);
                    model.insert(0, (id(i), e));
                    prop_assert_eq!(map.put(id(i), b.into(), t.into()), old);
                }
                Op::Promote(i, t) => {
                    let at = model.iter().position(|m| m.0 == id(i));
                    if let Some(p) = at {
                        let (k, e) = model.remove(p);
                        model.insert(0, (k, Entry { read_at: t.into(), ..e }));
                    }
                    prop_assert_eq!(map.promote(id(i), t.into()), at.is_some());
                }
                Op::Pop(i) => {
                    let old = model.iter().position(|m| m.0 == id(i)).map(|p| model.remove(p).1);
                    prop_assert_eq!(map.pop(id(i)), old);
                }
                Op::PopLru => prop_assert_eq!(map.pop_lru(), model.pop()),
            }
            prop_assert_eq!(order(&map), model.clone());
            let back: Vec<_> = map.iter().rev().collect();
            prop_assert_eq!(back, model.iter().rev().copied().collect::<Vec<_>>());
            prop_assert_eq!((map.len(), map.is_empty()), (model.len(), model.is_empty()));
            for p in 0..4u64 {
                prop_assert_eq!(map.contains_placement(p), model.iter().any(|m| (m.0 >> 64) as u64 == p));
            }
            for i in 0..32 {
                prop_assert_eq!(map.peek(id(i)), model.iter().find(|m| m.0 == id(i)).map(|m| m.1));
            }
        }
    }
}
