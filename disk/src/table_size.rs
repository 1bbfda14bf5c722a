//! How large a slot makes the tables it publishes and fills as it goes (`meta_table`,
//! `packed_table`). Entries land at random places, so every page of a table is touched and its
//! whole size is memory (the run directory is often a tmpfs): a table is kept from 58% to 7/8
//! full. Two windows per key, and keys moved between them (`seq_table.rs`), let one fill to about
//! 90% before a key first finds no place; a table made again grows by half, not double.

/// Whether a table of `capacity` entries holding `held` should be made again, larger.
pub fn crowded(held: usize, capacity: usize) -> bool {
    held.saturating_mul(8) > capacity.saturating_mul(7)
}

/// The capacity a crowded table of `capacity` entries is made again at.
pub fn grown(capacity: usize) -> usize {
    capacity.saturating_add(capacity / 2).max(capacity + 1)
}

/// The capacity of a table made for `entries` at once: 3/4 full.
pub fn holding(entries: usize) -> usize {
    entries.saturating_add(entries / 3)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_grows_by_half_once_seven_eighths_full_and_is_made_three_quarters_full() {
        assert!(!crowded(7, 8) && crowded(8, 8));
        assert!(!crowded(875, 1000) && crowded(876, 1000));
        assert_eq!((grown(1000), grown(1)), (1500, 2));
        assert_eq!(holding(3000), 4000);
        assert!(!crowded(3000, holding(3000)), "a table made for its entries is not crowded");
        assert!(!crowded(876, grown(1000)), "nor is one just grown");
    }
}
