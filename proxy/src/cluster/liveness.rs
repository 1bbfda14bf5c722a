//! Which members a slot sends reads to now. A member that failed a read (refused, reset, no answer
//! within the peer deadline) is *suspect*: reads go around it at once, and it is asked again only
//! once its back-off has passed (3 s, doubling with each failure in a row up to 16×), so a dead node
//! costs each slot one failed attempt per back-off, not one per read. A suspect member is also probed
//! in the background once its back-off has passed, so it is seen alive again without waiting for a
//! read. A member the membership says is
//! not up (its etcd lease expired), or that kept failing for a minute, is *down*. None of this moves
//! ownership (C2): the next owner serves a suspect member's chunks until it answers again.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use memarts_protocol::peer::MemberState;

/// Failing this long in a row makes a member down rather than suspect (for `memarts cluster status`;
/// routing treats both alike).
const DOWN_AFTER: Duration = Duration::from_secs(60);

struct Entry {
    failing_since: Instant,
    failures: u32,
    retry_at: Instant,
    since: SystemTime,
}

pub struct Liveness {
    backoff: Duration,
    failing: Mutex<HashMap<String, Entry>>,
    /// When each member was last seen to change state, for the status (ids without an entry: never).
    changed: Mutex<HashMap<String, SystemTime>>,
}

impl Liveness {
    pub fn new(backoff: Duration) -> Liveness {
        Liveness { backoff, failing: Mutex::default(), changed: Mutex::default() }
    }

    fn failing(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.failing.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a read may go to `id` now: it is not failing, or its back-off has passed.
    pub fn usable(&self, id: &str) -> bool {
        self.failing().get(id).is_none_or(|e| Instant::now() >= e.retry_at)
    }

    /// The failing members whose back-off has passed: to be asked whether they answer again.
    pub fn due(&self) -> Vec<String> {
        let now = Instant::now();
        self.failing().iter().filter(|(_, e)| now >= e.retry_at).map(|(id, _)| id.clone()).collect()
    }

    /// A read from `id` failed.
    pub fn failed(&self, id: &str) {
        let now = Instant::now();
        let mut failing = self.failing();
        let entry = failing.entry(id.to_string()).or_insert_with(|| Entry {
            failing_since: now,
            failures: 0,
            retry_at: now,
            since: SystemTime::now(),
        });
        entry.failures += 1;
        let factor = 1u32 << (entry.failures - 1).min(4);
        entry.retry_at = now + self.backoff * factor;
        if entry.failures == 1 {
            tracing::warn!(node = id, "peer failed a read: routing around it for {:?}", self.backoff);
        }
    }

    /// A read from `id` worked.
    pub fn succeeded(&self, id: &str) {
        if self.failing().remove(id).is_some() {
            tracing::info!(node = id, "peer answers again");
            self.changed.lock().unwrap_or_else(|p| p.into_inner()).insert(id.to_string(), SystemTime::now());
        }
    }

    /// `id`'s state and since when, given whether the membership says it is up.
    pub fn state(&self, id: &str, up: bool) -> (MemberState, SystemTime) {
        let failing = self.failing();
        match failing.get(id) {
            _ if !up => (MemberState::Down, self.changed_at(id)),
            Some(e) if e.failing_since.elapsed() >= DOWN_AFTER => (MemberState::Down, e.since),
            Some(e) => (MemberState::Suspect, e.since),
            None => (MemberState::Alive, self.changed_at(id)),
        }
    }

    fn changed_at(&self, id: &str) -> SystemTime {
        self.changed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .copied()
            .unwrap_or(SystemTime::UNIX_EPOCH)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_member_is_skipped_until_its_backoff_passes_and_back_once_it_answers() {
        let l = Liveness::new(Duration::from_millis(50));
        assert!(l.usable("b"));
        l.failed("b");
        assert!(!l.usable("b"));
        assert_eq!(l.state("b", true).0, MemberState::Suspect);
        std::thread::sleep(Duration::from_millis(60));
        assert!(l.usable("b"), "asked again once the back-off has passed");
        l.failed("b");
        std::thread::sleep(Duration::from_millis(60));
        assert!(!l.usable("b"), "a second failure in a row doubles the back-off");
        l.succeeded("b");
        assert!(l.usable("b"));
        assert_eq!(l.state("b", true).0, MemberState::Alive);
        assert_eq!(l.state("b", false).0, MemberState::Down);
    }
}
