use super::*;

static MOVES: Shape =
    Shape { magic: 1, version: 1, header_words: 4, entry_words: 4, superseded: 3, probes: 8, moves: true };
static STAYS: Shape = Shape { moves: false, ..MOVES };

fn words(shape: &Shape, capacity: usize) -> Vec<AtomicU64> {
    (0..shape.header_words + capacity * shape.entry_words).map(|_| AtomicU64::new(0)).collect()
}

/// Keys as slots make them: hashes (a splitmix64 sequence), never 0.
fn key(i: u64) -> u128 {
    let next = |x: u64| {
        let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    u128::from(next(i)) | u128::from(next(!i)) << 64
}

/// Inserts keys 0.. with their value (word 3) until one finds no place; how many went in.
fn fill(table: &SeqTable, limit: u64) -> u64 {
    (0..limit)
        .take_while(|&i| match table.claim(key(i), None) {
            Some((place, Claim::Free)) => {
                table.write(place, key(i), |e| e[3].store(i, Ordering::Relaxed));
                true
            }
            _ => false,
        })
        .count() as u64
}

fn value(table: &SeqTable, key: u128) -> Option<u64> {
    table.find(key, |e| e[3].load(Ordering::Relaxed), Some).map(|found| found.fields)
}

#[test]
fn a_table_fills_to_about_ninety_percent_with_moves_and_every_key_is_found() {
    for capacity in [1_000, 4_099, 20_000] {
        let w = words(&MOVES, capacity);
        let table = SeqTable::init(&w, &MOVES, |_| {}).unwrap();
        assert_eq!(table.capacity(), capacity, "any capacity");
        let held = fill(&table, capacity as u64);
        assert!(held * 100 >= capacity as u64 * 85, "{held} of {capacity} before one found no place");
        for i in 0..held {
            assert_eq!(value(&table, key(i)), Some(i), "key {i} of {held}");
        }
        assert_eq!(value(&table, key(held + 1)), None);
        // Without moves (a table readers write to), two windows still hold well over half.
        let w = words(&STAYS, capacity);
        let table = SeqTable::init(&w, &STAYS, |_| {}).unwrap();
        let held = fill(&table, capacity as u64);
        assert!(held * 100 >= capacity as u64 * 55, "{held} of {capacity} without moves");
        assert!((0..held).all(|i| value(&table, key(i)) == Some(i)));
    }
}

/// A new table filled from distinct keys (a start, a growth) to 7/8, each key placed by the first
/// free place of its windows: every key goes in, and is found.
#[test]
fn a_new_table_filled_with_vacant_claims_takes_every_key_to_seven_eighths() {
    let capacity = 10_000;
    let w = words(&MOVES, capacity);
    let table = SeqTable::init(&w, &MOVES, |_| {}).unwrap();
    for i in 0..8_750 {
        let (place, how) = table.claim_vacant(key(i), None).expect("a place");
        assert_eq!(how, Claim::Free, "key {i}");
        table.write(place, key(i), |e| e[3].store(i, Ordering::Relaxed));
    }
    assert!((0..8_750).all(|i| value(&table, key(i)) == Some(i)));
}

#[test]
fn a_withdrawn_key_is_gone_and_its_place_taken_again_and_a_vacant_claim_finds_a_free_one() {
    let w = words(&MOVES, 64);
    let table = SeqTable::init(&w, &MOVES, |_| {}).unwrap();
    let held = fill(&table, 48);
    assert_eq!(held, 48);
    assert!(table.withdraw(key(7)) && !table.withdraw(key(7)));
    assert_eq!(value(&table, key(7)), None);
    assert!((0..48).filter(|&i| i != 7).all(|i| value(&table, key(i)) == Some(i)));
    let (place, how) = table.claim_vacant(key(100), None).unwrap();
    assert_eq!((table.key_at(place), how), (0, Claim::Free));
    assert_eq!(table.claim(key(3), None).map(|(_, how)| how), Some(Claim::Own));
}

/// Readers in other threads while the writer fills a table to its limit and keeps it there,
/// taking keys out and putting them back (which moves others): a key is found with its own
/// value or not at all, never with another's.
#[test]
fn readers_never_see_another_keys_value_while_keys_move() {
    let capacity = 4_000;
    let w = words(&MOVES, capacity);
    let table = SeqTable::init(&w, &MOVES, |_| {}).unwrap();
    let done = std::sync::atomic::AtomicBool::new(false);
    let start = std::sync::Barrier::new(3);
    std::thread::scope(|s| {
        let readers: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| {
                    let reader = SeqTable::open(&w, &MOVES).unwrap();
                    start.wait();
                    let mut found = 0u64;
                    while !done.load(Ordering::Acquire) {
                        for i in 0..capacity as u64 * 3 {
                            if let Some(v) = value(&reader, key(i)) {
                                assert_eq!(v, i, "key {i} read with another key's value");
                                found += 1;
                            }
                        }
                    }
                    found
                })
            })
            .collect();
        start.wait();
        // Held keys are `next - held..next`: each round takes the oldest 100 out and puts 100
        // new ones in, into a table as full as it gets, where many have to move another key.
        // (No assertion until the readers are told to stop: a panic here would leave them
        // reading for ever.)
        let held = fill(&table, capacity as u64);
        let (mut next, mut refused) = (held, Vec::new());
        for _ in 0..50 {
            for old in next - held..next - held + 100 {
                table.withdraw(key(old));
            }
            for _ in 0..100 {
                match table.claim(key(next), None) {
                    Some((place, Claim::Free)) => {
                        table.write(place, key(next), |e| e[3].store(next, Ordering::Relaxed))
                    }
                    _ => refused.push(next),
                }
                next += 1;
            }
        }
        done.store(true, Ordering::Release);
        assert!(refused.len() < 50, "{} of 5,000 new keys found no place", refused.len());
        for i in next - held..next {
            let want = (!refused.contains(&i)).then_some(i);
            assert_eq!(value(&table, key(i)), want, "every key held is found, and only those");
        }
        for reader in readers {
            assert!(reader.join().unwrap() > 0, "the readers read");
        }
    });
}
