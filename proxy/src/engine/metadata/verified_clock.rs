//! When the metadata cache's entries were verified, in 4 bytes each (`url_lru.rs`) where an
//! `Instant` takes 16.
//!
//! A [`Stamp`] counts units (a millisecond unless the TTL is over ~6 days: then TTL / 2^29) from a
//! base `Instant`, offset by 2^30 units so that times up to twice the TTL before the base, which
//! loaded and peer-confirmed entries have, count too. Stamps round down, so an entry is taken as
//! verified up to one unit earlier than it was (it expires up to a millisecond early, never late).
//! Before stamps run out (~37 days at a millisecond), the base moves on by 2^31 units
//! ([`Clock::rebase`]) and the holder takes that from every stamp; a stamp that would go below
//! zero stays at zero, which is more than twice the TTL ago: expired, as it was.

use std::time::{Duration, Instant};

/// The stamp of the base.
const ORIGIN: i64 = 1 << 30;
/// The base moves on once now's stamp is past this, by [`SHIFT`] units.
const REBASE_AT: u32 = u32::MAX - (1 << 30);
const SHIFT: u32 = 1 << 31;

/// A verification time, as a [`Clock`] counts it; later ones are greater.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Stamp(u32);

impl Stamp {
    /// The same time, counted from a base `shift` units later ([`Clock::rebase`]).
    pub fn earlier_by(self, shift: u32) -> Stamp {
        Stamp(self.0.saturating_sub(shift))
    }
}

#[derive(Debug)]
pub struct Clock {
    base: Instant,
    unit_ms: u64,
}

impl Clock {
    /// A clock for entries verified at most `ttl` before they are stamped.
    pub fn new(ttl: Duration) -> Clock {
        Clock::from(Instant::now(), ttl)
    }

    fn from(base: Instant, ttl: Duration) -> Clock {
        // 2^30 units are at least twice the TTL.
        let unit_ms = (ttl.as_millis() as u64).div_ceil(1 << 29).max(1);
        Clock { base, unit_ms }
    }

    pub fn stamp(&self, at: Instant) -> Stamp {
        let units = match at.checked_duration_since(self.base) {
            Some(after) => (after.as_millis() as u64 / self.unit_ms) as i64,
            None => -((self.base - at).as_nanos().div_ceil(self.unit_ms as u128 * 1_000_000) as i64),
        };
        Stamp((ORIGIN + units).clamp(0, u32::MAX as i64) as u32)
    }

    /// How long before `now` the time `stamp` was (zero if after it).
    pub fn age(&self, stamp: Stamp, now: Instant) -> Duration {
        let since_base = match now.checked_duration_since(self.base) {
            Some(d) => d.as_nanos() as i128,
            None => -((self.base - now).as_nanos() as i128),
        };
        let stamped = (stamp.0 as i128 - ORIGIN as i128) * self.unit_ms as i128 * 1_000_000;
        Duration::from_nanos((since_base - stamped).clamp(0, u64::MAX as i128) as u64)
    }

    /// Moves the base on if stamps near their end at `now`; then every stamp held must be made
    /// [`Stamp::earlier_by`] the units returned.
    pub fn rebase(&mut self, now: Instant) -> Option<u32> {
        if self.stamp(now).0 <= REBASE_AT {
            return None;
        }
        self.base += Duration::from_millis(SHIFT as u64 * self.unit_ms);
        Some(SHIFT)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_keep_order_and_age_to_the_millisecond() {
        let now = Instant::now();
        let clock = Clock::new(Duration::from_secs(60));
        let (earlier, later) = (now - Duration::from_millis(90_000), now - Duration::from_millis(30));
        assert!(clock.stamp(earlier) < clock.stamp(later));
        for at in [earlier, later, now] {
            let age = clock.age(clock.stamp(at), now);
            let truth = now - at;
            assert!(age >= truth && age < truth + Duration::from_millis(1), "{age:?} for {truth:?}");
        }
    }

    #[test]
    fn after_a_rebase_ages_are_kept_and_very_old_stamps_stay_expired() {
        let ttl = Duration::from_secs(60);
        let now = Instant::now();
        let mut clock = Clock::from(now - Duration::from_millis((3 << 30) + 1000), ttl);
        let (recent, ancient) = (clock.stamp(now - Duration::from_secs(10)), clock.stamp(clock.base));
        let shift = clock.rebase(now).expect("stamps near their end");
        assert!(clock.rebase(now).is_none(), "once is enough");
        let age = clock.age(recent.earlier_by(shift), now);
        assert!(age >= Duration::from_secs(10) && age < Duration::from_millis(10_001), "{age:?}");
        assert!(clock.age(ancient.earlier_by(shift), now) > ttl * 2);
        assert!(clock.stamp(now) > recent.earlier_by(shift));
    }

    #[test]
    fn a_long_ttl_counts_in_coarser_units() {
        let ttl = Duration::from_secs(3600 * 24 * 365);
        let now = Instant::now();
        let clock = Clock::new(ttl);
        let at = now - ttl * 2 + Duration::from_secs(1);
        assert!(clock.age(clock.stamp(at), now) >= now - at);
        assert!(clock.age(clock.stamp(at), now) < now - at + Duration::from_millis(clock.unit_ms));
    }
}
