//! The reports of local reads (`Request::Touched`, `shim/src/touch.rs`): a reader never waits for a
//! slot's answer, so a slot that stops answering does not hold local reads up, and once it answers
//! again (or the fleet started again) the reads it is told of are counted.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use memarts_shim::Client;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::common::{moto, pattern, Fleet};

const MIB: u64 = 1 << 20;

/// Continues a stopped proxy when the test ends, whatever happens in it.
struct Stopped(Pid);

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = kill(self.0, Signal::SIGCONT);
    }
}

/// `n` objects of `size` bytes in a new bucket, read once (cold) through a fleet of 2 slots and
/// cached. Without resident chunks: reads of resident chunks are not reported (their slots count them
/// from the resident tables), and these are tests of the reports.
fn cached_objects(name: &str, n: u64, seed: u64, size: usize) -> (Vec<(String, Vec<u8>)>, Fleet, Client) {
    let bucket = moto().bucket(name);
    let objects: Vec<(String, Vec<u8>)> =
        (0..n).map(|i| (format!("s3://{bucket}/o{i:02}"), pattern(seed + i, size))).collect();
    for (url, data) in &objects {
        moto().put(&bucket, url.rsplit('/').next().unwrap(), data);
    }
    let fleet = Fleet::start(2, &[("MEMARTS_RESIDENT_MEMORY", "0")]);
    fleet.wait_index_ready();
    let client = fleet.client(MIB);
    for (url, data) in &objects {
        assert!(client.read(url).unwrap() == *data, "{url} cold");
    }
    fleet.wait_cached(objects.len() as u64);
    (objects, fleet, client)
}

#[test]
fn a_slot_that_stops_answering_does_not_hold_local_reads_up_and_counts_them_once_it_answers() {
    let (objects, fleet, client) = cached_objects("reports", 64, 9100, 8 << 10);
    // A warm round, reported: both slots have a report connection now.
    for (url, _) in &objects {
        client.read(url).unwrap();
    }
    client.send_read_reports();
    let hits_before = client.local_counters().unwrap().hits.load(Ordering::Relaxed);

    // Slot 1 stops answering. The reads go on, and report to it every 256 reads or so: 20 reports,
    // more than a slot may leave unanswered. A reader that waited for each answer (up to the 1 s
    // a report may take) would need 20 s and more.
    let stopped = Stopped(Pid::from_raw(fleet.pid(1)));
    kill(stopped.0, Signal::SIGSTOP).unwrap();
    let rounds = 80;
    let started = Instant::now();
    for round in 0..rounds {
        for (url, data) in &objects {
            assert!(client.read(url).unwrap() == *data, "{url}, round {round}, slot 1 stopped");
        }
    }
    let took = started.elapsed();
    let hits = client.local_counters().unwrap().hits.load(Ordering::Relaxed) - hits_before;
    assert_eq!(hits, rounds * objects.len() as u64, "every read served directly while slot 1 was stopped");
    assert!(
        took < Duration::from_secs(10),
        "{} local reads took {took:?} with a slot stopped: the reader waited for its answers",
        hits
    );

    // Answering again: what is read from now on is counted, by both slots.
    drop(stopped);
    client.send_read_reports();
    let counted = fleet.total("hits");
    for (url, _) in &objects {
        client.read(url).unwrap();
    }
    client.send_read_reports();
    assert_eq!(fleet.total("hits") - counted, objects.len() as u64, "the slots counted every read reported");

    // The fleet starts again under the same client: its report connections are dead, new ones
    // carry the counts.
    let _ = fleet.stop_proxy();
    fleet.start_proxy(2);
    fleet.wait_index_ready();
    for (url, data) in &objects {
        assert!(client.read(url).unwrap() == *data, "{url} after the restart");
    }
    client.send_read_reports();
    let (counted, direct_before) =
        (fleet.total("hits"), client.local_counters().unwrap().hits.load(Ordering::Relaxed));
    for (url, _) in &objects {
        client.read(url).unwrap();
    }
    client.send_read_reports();
    let direct = client.local_counters().unwrap().hits.load(Ordering::Relaxed) - direct_before;
    assert_eq!(direct, objects.len() as u64, "read directly after the restart");
    assert_eq!(fleet.total("hits") - counted, direct, "the restarted slots counted every read reported");
}

/// Set (to the fleet's run dir) in the child process of
/// [`a_process_that_ends_reports_its_local_reads_unasked`], with the URLs it reads.
const EXIT_CHILD_RUN_DIR: &str = "MEMARTS_TEST_EXIT_CHILD_RUN_DIR";
const EXIT_CHILD_URLS: &str = "MEMARTS_TEST_EXIT_CHILD_URLS";

/// A process that ends with its client still held (`exit`, no drop) has its local reads counted
/// by the slots all the same (the shim's exit hook sends them), and so has `memarts cat` (whose
/// read-ahead workers may still hold its client when it exits): nobody asks for the reports.
#[test]
fn a_process_that_ends_reports_its_local_reads_unasked() {
    if let Ok(run_dir) = std::env::var(EXIT_CHILD_RUN_DIR) {
        read_and_exit(&run_dir);
    }
    let (objects, fleet, client) = cached_objects("exitreports", 8, 9300, 100 << 10);
    drop(client);

    let hits = fleet.total("hits");
    let urls: Vec<&str> = objects.iter().map(|(u, _)| u.as_str()).collect();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "local_read_reports::a_process_that_ends_reports_its_local_reads_unasked"])
        .args(["--nocapture", "--test-threads=1"])
        .env(EXIT_CHILD_RUN_DIR, &fleet.run_dir)
        .env(EXIT_CHILD_URLS, urls.join(" "))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "the child failed: {stdout}{}", String::from_utf8_lossy(&out.stderr));
    // After the harness's "test <name> ... " on the same line.
    let local: u64 = stdout
        .split("local hits: ")
        .nth(1)
        .and_then(|rest| rest.lines().next())
        .unwrap_or_else(|| panic!("no count from the child: {stdout}"))
        .parse()
        .unwrap();
    assert_eq!(local, objects.len() as u64, "the child read every object locally");
    assert_eq!(fleet.total("hits") - hits, local, "the slots counted the reads of a process that ended");

    let hits = fleet.total("hits");
    for (url, data) in &objects {
        let out = fleet.memarts(&["cat", url]);
        assert!(out.status.success() && out.stdout == *data, "memarts cat {url}");
    }
    assert_eq!(fleet.total("hits") - hits, objects.len() as u64, "the slots counted memarts cat's reads");
}

/// The child of [`a_process_that_ends_reports_its_local_reads_unasked`]: reads the objects, says
/// how many chunks it read directly, and exits with its client still held.
fn read_and_exit(run_dir: &str) -> ! {
    let cfg = memarts_shim::ShimConfig { run_dir: run_dir.into(), chunk_size: MIB, ..Default::default() };
    let client = memarts_shim::Client::new(cfg).unwrap();
    for url in std::env::var(EXIT_CHILD_URLS).unwrap().split(' ') {
        client.read(url).unwrap();
    }
    println!("local hits: {}", client.local_counters().unwrap().hits.load(Ordering::Relaxed));
    std::mem::forget(client);
    std::process::exit(0);
}
