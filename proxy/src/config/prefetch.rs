//! The `[prefetch]` table: how a slot fetches the objects clients hint they will read next.

use serde::{Deserialize, Serialize};

use super::ConfigError;

/// Bounds of a slot's prefetcher. The number of objects fetched at once adapts between `min` and
/// `max` (AIMD: one more per completed fetch while hints wait, halved when the origin throttles);
/// small objects need many requests in flight to fill a link with a long round trip.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PrefetchConfig {
    /// Hints a slot keeps waiting at most; past it the oldest are dropped (counted).
    pub queue: usize,
    /// Objects fetched at once at the start.
    pub start: u32,
    /// The fewest the limit is cut to when the origin throttles.
    pub min: u32,
    /// The most objects fetched at once.
    pub max: u32,
    /// Bytes of one object a prefetch fetches at most (its first chunks): a hint for a huge object
    /// neither holds a fetcher for long nor fills the cache; reads fetch the rest.
    pub max_object_bytes: u64,
    /// Bytes of chunks a slot holds in memory for reads to come when the cache would not keep
    /// them (a dataset larger than the cache, `staging.rs`); 0: such chunks are not prefetched.
    pub staging_bytes: u64,
}

impl Default for PrefetchConfig {
    fn default() -> Self {
        PrefetchConfig {
            queue: 4096,
            start: 8,
            min: 1,
            max: 64,
            max_object_bytes: 64 << 20,
            staging_bytes: 64 << 20,
        }
    }
}

impl PrefetchConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(1..=1 << 20).contains(&self.queue) {
            return Err(ConfigError::invalid("prefetch.queue", "between 1 and 1048576", self.queue));
        }
        if self.staging_bytes > 1 << 40 {
            return Err(ConfigError::invalid("prefetch.staging_bytes", "at most 1 TiB", self.staging_bytes));
        }
        if !(1..=1024).contains(&self.max) {
            return Err(ConfigError::invalid("prefetch.max", "between 1 and 1024", self.max));
        }
        if !(1..=self.max).contains(&self.min) {
            return Err(ConfigError::invalid("prefetch.min", "between 1 and prefetch.max", self.min));
        }
        if !(self.min..=self.max).contains(&self.start) {
            return Err(ConfigError::invalid(
                "prefetch.start",
                "between prefetch.min and prefetch.max",
                self.start,
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bounds_are_checked() {
        PrefetchConfig::default().validate().unwrap();
        let bad = PrefetchConfig { min: 0, ..PrefetchConfig::default() };
        assert_eq!(bad.validate().unwrap_err().setting(), Some("prefetch.min"));
        let bad = PrefetchConfig { min: 9, start: 8, ..PrefetchConfig::default() };
        assert_eq!(bad.validate().unwrap_err().setting(), Some("prefetch.start"));
        let bad = PrefetchConfig { max: 0, ..PrefetchConfig::default() };
        assert_eq!(bad.validate().unwrap_err().setting(), Some("prefetch.max"));
        let bad = PrefetchConfig { queue: 0, ..PrefetchConfig::default() };
        assert_eq!(bad.validate().unwrap_err().setting(), Some("prefetch.queue"));
    }
}
