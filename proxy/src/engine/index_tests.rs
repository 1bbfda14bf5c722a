//! Tests of `index`.

use super::*;
use proptest::prelude::*;

/// The simplest correct model: a vector in recency order (front = least recent).
#[derive(Default)]
struct Model {
    order: Vec<(u128, u64)>,
    capacity: Option<u64>,
}

impl Model {
    fn used(&self) -> u64 {
        self.order.iter().map(|e| e.1).sum()
    }
    fn insert(&mut self, id: u128, bytes: u64) {
        self.order.retain(|e| e.0 != id);
        self.order.push((id, bytes));
    }
    fn touch(&mut self, id: u128) -> bool {
        let Some(pos) = self.order.iter().position(|e| e.0 == id) else { return false };
        let e = self.order.remove(pos);
        self.order.push(e);
        true
    }
    fn remove(&mut self, id: u128) -> Option<u64> {
        let pos = self.order.iter().position(|e| e.0 == id)?;
        Some(self.order.remove(pos).1)
    }
    fn evict(&mut self, keep: Option<u128>) -> Vec<(u128, u64)> {
        let mut victims = Vec::new();
        let Some(cap) = self.capacity else { return victims };
        let mut i = 0;
        let mut reached_keep = false;
        while self.used() > cap && i < self.order.len() {
            if Some(self.order[i].0) == keep {
                reached_keep = true;
                i += 1;
                continue;
            }
            victims.push(self.order.remove(i));
        }
        // The kept entry (the one just inserted) ends up most recent once eviction reached it.
        if reached_keep {
            self.touch(keep.expect("reached"));
        }
        victims
    }
}

#[derive(Debug, Clone)]
enum Op {
    Insert(u8, u16),
    InsertIfAbsent(u8, u16),
    Touch(u8),
    Remove(u8),
    Capacity(Option<u16>),
    Evict(Option<u8>),
}

/// Ids spread over 8 placements (the upper half), several ids per placement.
fn wide(i: u8) -> u128 {
    (u128::from(i % 8) << 64) | u128::from(i)
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (any::<u8>(), 1..5000u16).prop_map(|(i, b)| Op::Insert(i % 32, b)),
        1 => (any::<u8>(), 1..5000u16).prop_map(|(i, b)| Op::InsertIfAbsent(i % 32, b)),
        3 => any::<u8>().prop_map(|i| Op::Touch(i % 32)),
        1 => any::<u8>().prop_map(|i| Op::Remove(i % 32)),
        1 => proptest::option::of(0..20000u16).prop_map(Op::Capacity),
        2 => proptest::option::of(any::<u8>()).prop_map(|k| Op::Evict(k.map(|k| k % 32))),
    ]
}

proptest! {
    #[test]
    fn index_matches_model(ops in proptest::collection::vec(op(), 1..300)) {
        let mut real = ChunkIndex::default();
        let mut model = Model::default();
        for op in ops {
            match op {
                Op::Insert(id, b) => { real.insert(wide(id), b.into()); model.insert(wide(id), b.into()); }
                Op::InsertIfAbsent(id, b) => {
                    let absent = !model.order.iter().any(|e| e.0 == wide(id));
                    if absent { model.insert(wide(id), b.into()); }
                    prop_assert_eq!(real.insert_if_absent(wide(id), b.into()), absent);
                }
                Op::Touch(id) => prop_assert_eq!(real.touch(wide(id)), model.touch(wide(id))),
                Op::Remove(id) => prop_assert_eq!(real.remove(wide(id)), model.remove(wide(id))),
                Op::Capacity(c) => { real.set_capacity(c.map(u64::from)); model.capacity = c.map(u64::from); }
                Op::Evict(keep) => {
                    let keep = keep.map(wide);
                    prop_assert_eq!(real.evict_over_capacity(keep), model.evict(keep));
                    if let Some(cap) = model.capacity {
                        let kept = keep.and_then(|k| model.order.iter().find(|e| e.0 == k)).map_or(0, |e| e.1);
                        prop_assert!(real.used() <= cap.max(kept));
                    }
                }
            }
            prop_assert_eq!(real.used(), model.used());
            for p in 0..8u64 {
                let any = model.order.iter().any(|(id, _)| (id >> 64) as u64 == p);
                prop_assert_eq!(real.has_placement(p), any, "placement {}", p);
            }
            prop_assert_eq!(real.len(), model.order.len());
        }
    }
}
