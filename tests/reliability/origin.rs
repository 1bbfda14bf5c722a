//! Origin faults through the fault relay in front of moto: transient faults under cold reads, objects
//! replaced mid-read, the origin down, and credentials rotated while reading.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use rand::{Rng, SeedableRng};

use crate::common::fault_relay::{Fault, FaultRelay, Match};
use crate::common::{moto, pattern};
use crate::report::Row;
use crate::workload::{self, readers, stop_readers, wrong_bytes, Dataset, Tally};
use crate::Scale;

const CS: u64 = 256 << 10;

pub fn run(scale: Scale) -> Vec<Row> {
    vec![transient(scale), replaced(scale), down(scale), rotated_credentials(scale)]
}

/// 503 bursts, 500s, resets, truncated bodies, wrong ranges and stalls, one every 30–120 ms, while 16
/// readers read a dataset half again as large as the cache capacity (so misses go on all the time).
fn transient(scale: Scale) -> Row {
    let mut row = Row::new("origin", "503 bursts, 500, resets, truncated bodies, wrong ranges, stalls");
    let started = Instant::now();
    let relay = FaultRelay::start(&moto().endpoint);
    let data = Arc::new(Dataset::put("transient", 96, 2 << 20, 11));
    let (_cfg, fleet) = relay.fleet(2, "", &[("MEMARTS_CACHE_CAPACITY", "64MiB")]);
    let retries_before = fleet.total("origin_retries");
    let stop = Arc::new(AtomicBool::new(false));
    let (tally, handles) = readers(&fleet, &data, 16, CS, &stop);
    let mut rng = rand::rngs::StdRng::seed_from_u64(12);
    let until = Instant::now() + Duration::from_secs(scale.pick(10, 60));
    // Each fault is aimed at one object, and an object gets a new one only once its last was taken
    // and some seconds have passed (else a fresh burst could meet the same read's next attempts):
    // bursts a retry budget is made for, not an origin that fails every attempt of one read.
    let mut last_aimed: std::collections::HashMap<String, Instant> = Default::default();
    while Instant::now() < until {
        std::thread::sleep(Duration::from_millis(rng.random_range(30..120)));
        let (fault, times) = match rng.random_range(0..12) {
            0..=2 => (Fault::Status(503), 3),
            3..=4 => (Fault::Status(500), 1),
            5..=6 => (Fault::Reset, 1),
            7..=8 => (Fault::Truncate, 1),
            9..=10 => (Fault::WrongRange, 1),
            _ => (Fault::Stall(Duration::from_secs(3)), 1),
        };
        let key = format!("{}/{}", data.bucket, data.objects[rng.random_range(0..data.objects.len())].0);
        let rested = last_aimed.get(&key).is_none_or(|t| t.elapsed() > Duration::from_secs(5));
        if rested && relay.pending_for(&key) == 0 && relay.pending() < 16 {
            last_aimed.insert(key.clone(), Instant::now());
            let when = Match { method: Some("GET"), ranged: true, path_contains: Some(key) };
            relay.inject(when, fault, times);
        }
    }
    relay.clear();
    std::thread::sleep(Duration::from_secs(1));
    stop_readers(&stop, handles);
    tally.add_to(&mut row);
    row.injected = relay.injected();
    row.detected = fleet.total("origin_retries") - retries_before;
    if row.detected < row.injected {
        row.violate(format!("{} faults injected but only {} retries", row.injected, row.detected));
    }
    row.note = format!(
        "detected = origin requests retried (a fault can cost more than one retry: a stall is cut by the \
         attempt deadline, then retried); {} origin requests through the relay, {} reads verified, \
         cache capacity two thirds of the dataset",
        relay.requests(),
        Tally::get(&tally.calls)
    );
    row.seconds = started.elapsed().as_secs_f64();
    row
}

/// Each object is overwritten at the origin right after the first GET of a read: a read pinned to the
/// first version gets a typed `Stale` or the first version whole; an unpinned read gets one version
/// whole.
fn replaced(scale: Scale) -> Row {
    let mut row = Row::new("origin", "object replaced between two chunk fetches");
    let started = Instant::now();
    let relay = FaultRelay::start(&moto().endpoint);
    let bucket = moto().bucket("replaced");
    let (_cfg, fleet) = relay.fleet(2, "", &[]);
    let client = workload::client(&fleet, CS, Duration::from_secs(30));
    for i in 0..scale.pick(8, 40) {
        let key = format!("r{i}");
        let (v1, v2) = (pattern(5000 + i, 6 * CS as usize + 99), pattern(6000 + i, 6 * CS as usize + 99));
        moto().put(&bucket, &key, &v1);
        let (b, k, v) = (bucket.clone(), key.clone(), v2.clone());
        relay.inject(Match::ranged_get(&key), Fault::Replace(Arc::new(move || moto().put(&b, &k, &v))), 1);
        row.injected += 1;
        let url = format!("s3://{bucket}/{key}");
        let meta = client.stat(&url).unwrap();
        let mut buf = vec![0u8; v1.len()];
        match client.read_at(&url, &meta, 0, &mut buf[..]) {
            Ok(n) => {
                row.bytes_verified += n as u64;
                row.wrong_bytes += wrong_bytes(&buf[..n], &v1);
            }
            Err(memarts_shim::Error::Stale(_)) => {
                row.detected += 1;
                row.expected_errors += 1;
            }
            Err(e) => {
                row.failed_calls += 1;
                row.violate(format!("a pinned read of a replaced object: {e} (expected Stale)"));
            }
        }
        match client.read(&url) {
            Ok(whole) => {
                row.bytes_verified += whole.len() as u64;
                row.wrong_bytes += wrong_bytes(&whole, &v1).min(wrong_bytes(&whole, &v2));
            }
            Err(e) => {
                row.failed_calls += 1;
                row.violate(format!("an unpinned read after the replacement: {e}"));
            }
        }
    }
    if row.detected == 0 {
        row.violate("no pinned read ever met the replaced object");
    }
    row.note = "detected = pinned reads that got a typed Stale (the others had the chunks they needed \
                already); unpinned reads return one whole version"
        .into();
    row.seconds = started.elapsed().as_secs_f64();
    row
}

/// With the origin unreachable, 16 readers of cached data (past the metadata TTL) see no failure,
/// memarts-only objects are served, and misses fail with a typed origin error within the deadline.
fn down(scale: Scale) -> Row {
    let mut row = Row::new("origin", "origin down (connections reset)");
    let started = Instant::now();
    let relay = FaultRelay::start(&moto().endpoint);
    let cached = Arc::new(Dataset::put("downcached", 16, 1 << 20, 21));
    let missed = Dataset::put("downmissed", 8, 1 << 20, 22);
    let (_cfg, fleet) = relay.fleet(2, "meta_ttl_secs = 0.5", &[]);
    let client = workload::client(&fleet, CS, Duration::from_secs(30));
    let mut chunks = 0;
    for (i, (_, want)) in cached.objects.iter().enumerate() {
        assert!(client.read(&cached.url(i)).unwrap() == *want);
        chunks += (want.len() as u64).div_ceil(CS);
    }
    let only: Vec<(String, Vec<u8>)> =
        (0..8).map(|i| (format!("s3://{}/only/{i}", cached.bucket), pattern(7000 + i, 300_000))).collect();
    for (url, data) in &only {
        client.put_memarts_bytes(url, data).unwrap();
    }
    fleet.wait_cached(chunks);

    relay.set_down(true);
    let stop = Arc::new(AtomicBool::new(false));
    let (tally, handles) = readers(&fleet, &cached, 16, CS, &stop);
    let until = Instant::now() + Duration::from_secs(scale.pick(5, 20));
    let mut slowest = Duration::ZERO;
    while Instant::now() < until {
        for (url, data) in &only {
            let mut sink = memarts_shim::VecSink::default();
            match client.read_memarts_to(url, &mut sink) {
                // SAFETY: read_memarts_to returned Ok, so every reserved byte was written.
                Ok(_) => tally.check(&unsafe { sink.finish() }, data),
                Err(e) => tally.fail(format!("memarts-only {url} with the origin down: {e}")),
            }
        }
        for i in 0..missed.objects.len() {
            let t = Instant::now();
            match client.read(&missed.url(i)) {
                Err(memarts_shim::Error::Origin(_)) => row.expected_errors += 1,
                Err(e) => row.violate(format!("a miss with the origin down: {e} (expected an origin error)")),
                Ok(_) => row.violate("a miss succeeded with the origin down"),
            }
            slowest = slowest.max(t.elapsed());
        }
    }
    stop_readers(&stop, handles);
    relay.set_down(false);
    for (i, (_, want)) in missed.objects.iter().enumerate() {
        match client.read(&missed.url(i)) {
            Ok(got) => tally.check(&got, want),
            Err(e) => tally.fail(format!("a miss once the origin was back: {e}")),
        }
    }
    tally.add_to(&mut row);
    if slowest >= client.config().deadline {
        row.violate(format!(
            "a miss took {slowest:?} to fail, past the {:?} deadline",
            client.config().deadline
        ));
    }
    row.injected = 1;
    row.detected = 1;
    row.note = format!(
        "cached objects (metadata past its TTL), memarts-only objects and, once the origin is back, the \
         misses: all byte-exact; with the origin down each miss failed with a typed origin error, the \
         slowest after {:.1} s (deadline {:?})",
        slowest.as_secs_f64(),
        client.config().deadline
    );
    row.seconds = started.elapsed().as_secs_f64();
    row
}

fn rfc3339(t: SystemTime) -> String {
    chrono::DateTime::<chrono::Utc>::from(t).to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

fn write_credentials(path: &std::path::Path, key: &str, expires: SystemTime) {
    let tmp = path.with_extension("tmp");
    let body = format!(
        r#"{{"AccessKeyId": "{key}", "AccessKeySecret": "secret-of-{key}", "Expiration": "{}"}}"#,
        rfc3339(expires)
    );
    std::fs::write(&tmp, body).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// Short-lived credentials (a few seconds) in a credentials file that a rotator rewrites before each
/// expires; the relay refuses any key that is not currently valid. 16 readers must not notice.
fn rotated_credentials(scale: Scale) -> Row {
    let mut row = Row::new("origin", "credentials file rotated while reading (keys expire after 4 s)");
    let started = Instant::now();
    let relay = FaultRelay::start(&moto().endpoint);
    let data = Arc::new(Dataset::put("rotated", 96, 2 << 20, 31));
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("credentials.json");
    let lifetime = Duration::from_secs(4);
    let mut keys: Vec<(String, SystemTime)> = vec![("key-0".into(), SystemTime::now() + lifetime)];
    write_credentials(&file, &keys[0].0, keys[0].1);
    let valid = |keys: &[(String, SystemTime)]| {
        let now = SystemTime::now();
        Some(keys.iter().filter(|(_, exp)| *exp > now).map(|(k, _)| k.clone()).collect::<Vec<_>>())
    };
    relay.allow_keys(valid(&keys));
    let file_env = file.display().to_string();
    let (_cfg, fleet) =
        relay.fleet(2, "", &[("MEMARTS_CREDENTIALS_FILE", &file_env), ("MEMARTS_CACHE_CAPACITY", "64MiB")]);
    let stop = Arc::new(AtomicBool::new(false));
    let (tally, handles) = readers(&fleet, &data, 16, CS, &stop);
    let until = Instant::now() + Duration::from_secs(scale.pick(12, 40));
    let mut next_rotation = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
        if Instant::now() >= next_rotation {
            // A new key two seconds before the current one expires, as an STS refresher would.
            let key = format!("key-{}", keys.len());
            let expires = SystemTime::now() + lifetime;
            keys.push((key.clone(), expires));
            // The origin knows a key before anyone can read it from the file (an STS key is valid
            // when it is issued): allowed after the write, a slot that read the file at once
            // could sign with a key the relay did not know yet.
            relay.allow_keys(valid(&keys));
            write_credentials(&file, &key, expires);
            next_rotation += Duration::from_secs(2);
            // Counted when it has two seconds of reads ahead to be used in.
            if next_rotation < until {
                row.injected += 1;
            }
        }
        relay.allow_keys(valid(&keys));
    }
    stop_readers(&stop, handles);
    tally.add_to(&mut row);
    let seen = relay.keys_seen();
    row.detected =
        keys.iter().skip(1).take(row.injected as usize).filter(|(k, _)| seen.contains(k)).count() as u64;
    if relay.refused_keys() > 0 {
        row.note = format!("{} requests were refused for an expired key; ", relay.refused_keys());
    }
    row.note += &format!(
        "injected = rotations, detected = rotated keys the fleet signed with; {} origin requests, {} \
         reads verified",
        relay.requests(),
        Tally::get(&tally.calls)
    );
    row.seconds = started.elapsed().as_secs_f64();
    row
}
