//! Proxy faults: `kill -9` of random slots under 32 readers with the recovery script, a rolling
//! restart under load, and `kill -9` cycles during `write_memarts`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};

use crate::common::{pattern, Fleet};
use crate::report::Row;
use crate::workload::{self, readers, stop_readers, wrong_bytes, Dataset, Tally};
use crate::Scale;

const CS: u64 = 256 << 10;
const SLOTS: u32 = 4;

pub fn run(scale: Scale) -> Vec<Row> {
    vec![kill_under_readers(scale), rolling_restart(scale), kill_during_writes(scale)]
}

fn kill_9(pid: i32) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL)
        .expect("kill -9");
}

fn kill_under_readers(scale: Scale) -> Row {
    let mut row = Row::new("proxy", "kill -9 of a random slot, 32 readers, recovery script");
    let started = Instant::now();
    let data = Arc::new(Dataset::put("kill", scale.pick(24, 64), scale.pick(1 << 20, 2 << 20), 1));
    let fleet = Fleet::start(SLOTS, &[]);
    let stop = Arc::new(AtomicBool::new(false));
    let (tally, handles) = readers(&fleet, &data, 32, CS, &stop);
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let until = Instant::now() + Duration::from_secs(scale.pick(10, 60));
    let mut recovery = Vec::new();
    while Instant::now() < until {
        std::thread::sleep(Duration::from_millis(rng.random_range(1000..3000)));
        let slot = rng.random_range(0..SLOTS);
        let pid = fleet.pid(slot);
        kill_9(pid);
        row.injected += 1;
        let t = Instant::now();
        fleet.recover(SLOTS);
        recovery.push(t.elapsed().as_secs_f64());
        if fleet.pid(slot) != pid {
            row.detected += 1;
        }
    }
    stop_readers(&stop, handles);
    tally.add_to(&mut row);
    let calls = Tally::get(&tally.calls);
    let worst = recovery.iter().cloned().fold(0.0, f64::max);
    row.note = format!(
        "detected = killed slots found dead and replaced by `memarts-recover.sh`; recovery (stop + start \
         of the fleet) took {:.2} s on average, {worst:.2} s at worst; {calls} reads verified",
        recovery.iter().sum::<f64>() / recovery.len().max(1) as f64
    );
    row.seconds = started.elapsed().as_secs_f64();
    row
}

fn rolling_restart(scale: Scale) -> Row {
    let mut row = Row::new("proxy", "rolling restart of the fleet (`memarts restart_proxy`), 32 readers");
    let started = Instant::now();
    let data = Arc::new(Dataset::put("rolling", scale.pick(24, 64), scale.pick(1 << 20, 2 << 20), 2));
    let fleet = Fleet::start(SLOTS, &[]);
    let stop = Arc::new(AtomicBool::new(false));
    let (tally, handles) = readers(&fleet, &data, 32, CS, &stop);
    let mut took = Vec::new();
    for _ in 0..scale.pick(2, 5) {
        std::thread::sleep(Duration::from_secs(1));
        let before: Vec<i32> = (0..SLOTS).map(|s| fleet.pid(s)).collect();
        let t = Instant::now();
        let out = fleet.memarts(&["restart_proxy", "--grace", "10"]);
        took.push(t.elapsed().as_secs_f64());
        assert!(out.status.success(), "restart_proxy failed: {}", crate::common::text(&out.stderr));
        row.injected += SLOTS as u64;
        row.detected += (0..SLOTS).filter(|&s| fleet.pid(s) != before[s as usize]).count() as u64;
    }
    std::thread::sleep(Duration::from_secs(1));
    stop_readers(&stop, handles);
    tally.add_to(&mut row);
    row.note = format!(
        "injected = slot restarts, detected = slots that came back with a new pid; a whole roll took {:.2} s \
         on average; {} reads verified",
        took.iter().sum::<f64>() / took.len().max(1) as f64,
        Tally::get(&tally.calls)
    );
    row.seconds = started.elapsed().as_secs_f64();
    row
}

/// What a writer did: objects acknowledged, and objects whose write returned an error.
#[derive(Default)]
struct Writes {
    acked: Vec<(String, u64, usize)>,
    unacked: Vec<(String, u64, usize)>,
}

fn kill_during_writes(scale: Scale) -> Row {
    let cycles = scale.pick(15, 200);
    let mut row = Row::new("proxy", "kill -9 during write_memarts, 4 writers");
    let started = Instant::now();
    let fleet = Fleet::start(SLOTS, &[]);
    let bucket = format!("only-{}", std::process::id());
    let stop = Arc::new(AtomicBool::new(false));
    let writes = Arc::new(Mutex::new(Writes::default()));
    let handles: Vec<_> = (0..4u64)
        .map(|t| {
            let (stop, writes, bucket) = (stop.clone(), writes.clone(), bucket.clone());
            // Two writers give up quickly, so some writes are cut by a kill and never acknowledged.
            let deadline = Duration::from_millis(if t < 2 { 30 } else { 20_000 });
            let client = workload::client(&fleet, CS, deadline);
            std::thread::spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(100 + t);
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let url = format!("s3://{bucket}/w{t}/{i:06}");
                    let (seed, len) = (t * 1_000_000 + i, rng.random_range(1..(600 << 10)));
                    let ok = client.put_memarts_bytes(&url, &pattern(seed, len)).is_ok();
                    let mut w = writes.lock().unwrap();
                    if ok { &mut w.acked } else { &mut w.unacked }.push((url, seed, len));
                    i += 1;
                }
            })
        })
        .collect();
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    for _ in 0..cycles {
        std::thread::sleep(Duration::from_millis(rng.random_range(20..250)));
        let slot = rng.random_range(0..SLOTS);
        let pid = fleet.pid(slot);
        kill_9(pid);
        row.injected += 1;
        fleet.recover(SLOTS);
        if fleet.pid(slot) != pid {
            row.detected += 1;
        }
    }
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.join().expect("a writer panicked");
    }
    // A clean stop and start too: acknowledged objects survive both.
    fleet.stop_proxy();
    fleet.start_proxy(SLOTS);
    let writes = writes.lock().unwrap();
    let client = workload::client(&fleet, CS, Duration::from_secs(30));
    for (url, seed, len) in &writes.acked {
        let want = pattern(*seed, *len);
        match read_only(&client, url) {
            Ok(got) => {
                row.bytes_verified += *len as u64;
                row.wrong_bytes += wrong_bytes(&got, &want);
            }
            Err(e) => {
                row.acked_lost += 1;
                row.violate(format!("acknowledged {url} lost: {e}"));
            }
        }
    }
    for (url, seed, len) in &writes.unacked {
        match read_only(&client, url) {
            Err(memarts_shim::Error::NotFound(_)) => {}
            Ok(got) if got == pattern(*seed, *len) => {}
            Ok(_) => row.partial_visible += 1,
            Err(e) => row.violate(format!("unacknowledged {url}: neither absent nor whole: {e}")),
        }
    }
    row.expected_errors = writes.unacked.len() as u64;
    row.note = format!(
        "detected = killed slots found dead and replaced by the recovery script; {} objects acknowledged \
         and read back after {cycles} kill -9 cycles and a clean restart; the {} writes cut by a kill \
         (expected errors: two of the writers give up after 30 ms) are absent or whole",
        writes.acked.len(),
        writes.unacked.len()
    );
    row.seconds = started.elapsed().as_secs_f64();
    row
}

fn read_only(client: &memarts_shim::Client, url: &str) -> memarts_shim::Result<Vec<u8>> {
    let mut sink = memarts_shim::VecSink::default();
    client.read_memarts_to(url, &mut sink)?;
    // SAFETY: read_memarts_to returned Ok, so every reserved byte was written.
    Ok(unsafe { sink.finish() })
}
