//! Tests of `prefetch`.

use super::*;

fn hint(n: u32) -> Hint {
    (format!("s3://b/{n}"), 4096)
}

#[test]
fn the_queue_is_bounded_drops_the_oldest_and_never_holds_a_hint_twice() {
    let p = Prefetcher::new(PrefetchConfig { queue: 3, ..PrefetchConfig::default() });
    assert_eq!(p.push(vec![hint(1), hint(2), hint(1)]), 2);
    assert_eq!(p.push(vec![hint(3), hint(4)]), 2);
    let s = p.status();
    assert_eq!((s.queued, s.dropped), (3, 2), "one duplicate, one oldest dropped");
    assert_eq!(p.next().unwrap(), hint(2));
    // Being fetched still counts as known.
    assert_eq!(p.push(vec![hint(2)]), 0);
}

#[test]
fn the_limit_grows_while_hints_wait_and_halves_once_per_burst_of_throttling() {
    let cfg = PrefetchConfig { start: 4, min: 1, max: 6, ..PrefetchConfig::default() };
    let p = Prefetcher::new(cfg);
    p.push((0..20).map(hint).collect());
    let running: Vec<Hint> = std::iter::from_fn(|| p.next().ok()).collect();
    assert_eq!(running.len(), 4, "no more than the limit at once");
    assert_eq!(p.next(), Err(None));
    for h in &running[..3] {
        p.finished(h, false);
    }
    assert_eq!(p.status().limit, 6, "+1 per completed fetch, up to max");
    p.finished(&running[3], true);
    let s = p.status();
    assert_eq!((s.limit, s.limit_low, s.throttled), (3, 3, 1));
    assert!(matches!(p.next(), Err(Some(_))), "new fetches pause after a cut");
    // After a cut it grows by one per `limit` completed fetches only.
    p.queue().paused_until = None;
    let three: Vec<Hint> = std::iter::from_fn(|| p.next().ok()).collect();
    assert_eq!(three.len(), 3);
    p.finished(&three[0], false);
    p.finished(&three[1], false);
    assert_eq!(p.status().limit, 3);
    p.finished(&three[2], false);
    assert_eq!(p.status().limit, 4);
    p.queue().limit = 3;
    // A second throttled fetch right after is the same burst: no second cut.
    p.queue().paused_until = None;
    let h = p.next().unwrap();
    p.finished(&h, true);
    assert_eq!(p.status().limit, 3);
    p.queue().last_cut = Some(Instant::now() - CUT_INTERVAL);
    p.queue().paused_until = None;
    let h = p.next().unwrap();
    p.finished(&h, true);
    let s = p.status();
    assert_eq!((s.limit, s.limit_low, s.throttled), (1, 1, 2));
    p.queue().paused_until = None;
    let h = p.next().unwrap();
    p.finished(&h, true);
    assert_eq!(p.status().limit, 1, "never below min");
}
