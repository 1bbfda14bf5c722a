//! Cluster faults (C1–C3, S6 of docs/RELIABILITY.md): three nodes, each a real fleet with its own
//! run dir, cache dir and peer address on loopback, readers on every node verifying every byte, and
//! one fault class per row: `kill -9` storms of whole nodes, nodes hung by `SIGSTOP`, a faulty link in
//! front of one node's peer listeners (resets, stalls, frames cut short, flipped bytes), and
//! strangers with wrong secrets and garbage on the peer ports. No read may fail and no byte may be
//! wrong: a peer's failure costs latency only.

mod attacks;
mod link;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use rand::{Rng, SeedableRng};

use crate::common::cluster::{free_ports, Cluster};
use crate::report::Row;
use crate::workload::{readers, stop_readers, Dataset, Tally};
use crate::Scale;

const CS: u64 = 256 << 10;
const NODES: usize = 3;

/// Short deadlines so that a fault costs a second or two, not the default ten.
const TIMEOUTS: &str = "peer_timeout_secs = 2\nconnect_timeout_secs = 1\nsuspect_secs = 1\n";

pub fn run(scale: Scale) -> Vec<Row> {
    vec![
        kill_storm(scale),
        hung_nodes(scale),
        faulty_link(scale),
        hostile_peers(scale),
        attacks::hostile_member(scale),
        attacks::on_path_attacker(scale),
    ]
}

fn slots(scale: Scale) -> u32 {
    scale.pick(2, 4)
}

fn dataset(hint: &str, scale: Scale, seed: u64) -> Arc<Dataset> {
    Arc::new(Dataset::put(hint, scale.pick(24, 64), scale.pick(1 << 20, 2 << 20), seed))
}

/// Readers on every node of `cluster`; returns their tallies and threads.
struct Readers {
    stop: Arc<AtomicBool>,
    tallies: Vec<Arc<Tally>>,
    handles: Vec<std::thread::JoinHandle<()>>,
}

impl Readers {
    fn start(cluster: &Cluster, data: &Arc<Dataset>, scale: Scale) -> Readers {
        let stop = Arc::new(AtomicBool::new(false));
        let (mut tallies, mut handles) = (Vec::new(), Vec::new());
        for node in &cluster.nodes {
            let (t, h) = readers(node, data, scale.pick(4, 8), CS, &stop);
            tallies.push(t);
            handles.extend(h);
        }
        Readers { stop, tallies, handles }
    }

    /// Stops the readers and adds what they did to `row`; returns the reads verified.
    fn finish(self, row: &mut Row) -> u64 {
        stop_readers(&self.stop, self.handles);
        let mut calls = 0;
        for t in &self.tallies {
            t.add_to(row);
            calls += Tally::get(&t.calls);
        }
        calls
    }
}

/// A counter summed over the slots of `memarts status --json` of node `i` (0 for a slot that does not
/// answer).
fn node_counter(cluster: &Cluster, i: usize, name: &str) -> u64 {
    cluster.nodes[i].status()["slots"]
        .as_array()
        .map(|slots| slots.iter().filter_map(|s| s["cluster"][name].as_u64()).sum())
        .unwrap_or(0)
}

/// A counter summed over every node of `cluster`.
fn pool_counter(cluster: &Cluster, name: &str) -> u64 {
    (0..cluster.nodes.len()).map(|i| node_counter(cluster, i, name)).sum()
}

/// A started pool of [`NODES`] nodes and readers on each over a fresh dataset.
fn started_pool(hint: &str, scale: Scale, seed: u64) -> (Cluster, Readers) {
    let data = dataset(hint, scale, seed);
    let cluster = Cluster::start(NODES, slots(scale), TIMEOUTS, &[]);
    let readers = Readers::start(&cluster, &data, scale);
    (cluster, readers)
}

/// Whether node `from` sees every member alive within `within`.
fn all_alive_within(cluster: &Cluster, from: usize, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        let status = cluster.status(from);
        if status["members"].as_array().is_some_and(|m| m.iter().all(|m| m["state"] == "alive")) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

fn kill_storm(scale: Scale) -> Row {
    let mut row = Row::new("cluster", "kill -9 of a whole node, 3 nodes, readers on each, restart");
    let started = Instant::now();
    let (cluster, readers) = started_pool("pool-kill", scale, 31);
    let mut rng = rand::rngs::StdRng::seed_from_u64(17);
    let until = Instant::now() + Duration::from_secs(scale.pick(12, 90));
    let mut back = Vec::new();
    while Instant::now() < until {
        std::thread::sleep(Duration::from_millis(rng.random_range(1000..3000)));
        let victim = rng.random_range(0..NODES);
        cluster.signal(victim, Signal::SIGKILL);
        row.injected += 1;
        // Others read on meanwhile; then the recovery script restarts the node, warm.
        std::thread::sleep(Duration::from_millis(rng.random_range(200..1500)));
        let t = Instant::now();
        cluster.nodes[victim].recover(cluster.slots);
        if all_alive_within(&cluster, (victim + 1) % NODES, Duration::from_secs(20)) {
            row.detected += 1;
            back.push(t.elapsed().as_secs_f64());
        } else {
            row.violate(format!("node {victim} was not seen alive again within 20 s of its restart"));
        }
    }
    let calls = readers.finish(&mut row);
    let worst = back.iter().cloned().fold(0.0, f64::max);
    row.note = format!(
        "detected = killed nodes restarted by `memarts-recover.sh` and seen alive by the others again \
         ({:.2} s on average, {worst:.2} s at worst); {calls} reads verified on the 3 nodes",
        back.iter().sum::<f64>() / back.len().max(1) as f64
    );
    row.seconds = started.elapsed().as_secs_f64();
    row
}

fn hung_nodes(scale: Scale) -> Row {
    let mut row = Row::new("cluster", "SIGSTOP of a whole node for 1-4 s, then SIGCONT, readers on each");
    let started = Instant::now();
    let (cluster, readers) = started_pool("pool-hung", scale, 32);
    let mut rng = rand::rngs::StdRng::seed_from_u64(18);
    let until = Instant::now() + Duration::from_secs(scale.pick(12, 90));
    let fallbacks_before: u64 = pool_counter(&cluster, "fallbacks");
    while Instant::now() < until {
        std::thread::sleep(Duration::from_millis(rng.random_range(500..2000)));
        let victim = rng.random_range(0..NODES);
        cluster.signal(victim, Signal::SIGSTOP);
        row.injected += 1;
        std::thread::sleep(Duration::from_millis(rng.random_range(1000..4000)));
        cluster.signal(victim, Signal::SIGCONT);
    }
    let calls = readers.finish(&mut row);
    let fallbacks: u64 = pool_counter(&cluster, "fallbacks");
    row.detected = fallbacks - fallbacks_before;
    row.note = format!(
        "detected = reads routed around a hung peer (fallbacks to the next owner or the origin); {calls} \
         reads verified, those of the hung node's own workers included (they wait for its SIGCONT)"
    );
    row.seconds = started.elapsed().as_secs_f64();
    row
}

fn faulty_link(scale: Scale) -> Row {
    let mut row =
        Row::new("cluster", "faulty link to a node's peers: resets, stalls, cut frames, flipped bytes");
    let started = Instant::now();
    let data = dataset("pool-link", scale, 33);
    let mut cluster = Cluster::new(NODES, slots(scale), TIMEOUTS, &[]);
    // The last node binds elsewhere; the address the others dial is the faulty link's.
    let hidden_ip = format!("127.0.0.{}", NODES + 2);
    let hidden = format!("{hidden_ip}:{}", free_ports(std::slice::from_ref(&hidden_ip), cluster.slots));
    let victim = NODES - 1;
    cluster.nodes[victim].extra_env.push(("MEMARTS_PEER_LISTEN".into(), hidden.clone()));
    let link = link::FaultyLink::start(
        &cluster.addresses[victim],
        &hidden,
        cluster.slots,
        1.0,
        Duration::from_secs(3),
        19,
    );
    for i in 0..NODES {
        cluster.start_node(i);
    }
    let readers = Readers::start(&cluster, &data, scale);
    let errors_before: u64 = (0..victim).map(|i| node_counter(&cluster, i, "peer_errors")).sum();
    std::thread::sleep(Duration::from_secs(scale.pick(12, 90)));
    let calls = readers.finish(&mut row);
    let errors: u64 =
        (0..victim).map(|i| node_counter(&cluster, i, "peer_errors")).sum::<u64>() - errors_before;
    let refused = node_counter(&cluster, victim, "refused_connections");
    row.injected = link.total_fired();
    row.detected = errors + refused;
    use link::Kind::*;
    row.note = format!(
        "injected = faults that fired on {} relayed connections ({} resets, {} stalls, {} cuts, {} flipped \
         bytes); detected = reads that met a fault and were routed around (peer errors of the other nodes, \
         {errors}) and connections the node refused ({refused}); faults that hit the background probes \
         of a node already suspect are not counted there; {calls} reads verified",
        link.connections.load(Ordering::Relaxed),
        link.fired(Reset),
        link.fired(Stall),
        link.fired(Cut),
        link.fired(Flip)
    );
    link.stop();
    row.seconds = started.elapsed().as_secs_f64();
    row
}

fn hostile_peers(scale: Scale) -> Row {
    let mut row =
        Row::new("cluster", "wrong secrets, garbage, oversized frames, idle crowds on the peer ports");
    let started = Instant::now();
    let (cluster, readers) = started_pool("pool-hostile", scale, 34);
    let cluster = Arc::new(cluster);
    let refused_before: u64 = pool_counter(&cluster, "refused_connections");
    let until = Instant::now() + Duration::from_secs(scale.pick(10, 60));
    let (attempts, typed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let strangers: Vec<_> = (0..6u64)
        .map(|t| {
            let (cluster, attempts, typed) = (cluster.clone(), attempts.clone(), typed.clone());
            std::thread::spawn(move || stranger(&cluster, 20 + t, until, &attempts, &typed))
        })
        .collect();
    for s in strangers {
        s.join().expect("a stranger panicked");
    }
    let calls = readers.finish(&mut row);
    let refused: u64 = pool_counter(&cluster, "refused_connections") - refused_before;
    row.injected = attempts.load(Ordering::Relaxed);
    row.detected = refused;
    let typed = typed.load(Ordering::Relaxed);
    if typed == 0 {
        row.violate("no wrong-secret client was refused");
    }
    row.note = format!(
        "injected = hostile connections (a member's name with a wrong secret, random bytes, a 2 GiB frame \
         head, a head then silence, crowds of 200 idle connections held for a second); detected = connections the \
         peer listeners refused and counted ({typed} wrong-secret clients got a typed refusal); {calls} \
         reads verified while members kept reading"
    );
    row.seconds = started.elapsed().as_secs_f64();
    row
}

/// One hostile client's loop on random slots of random nodes until `until`.
fn stranger(cluster: &Cluster, seed: u64, until: Instant, attempts: &AtomicU64, typed: &AtomicU64) {
    use memarts_proxy::cluster::auth::Secret;
    use memarts_proxy::cluster::peer_client::{slot_address, PeerClient, PeerError};
    use memarts_proxy::cluster::Member;
    use std::io::{Read, Write};

    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    while Instant::now() < until {
        let i = rng.random_range(0..NODES);
        let slot = rng.random_range(0..cluster.slots);
        let address = slot_address(&cluster.addresses[i], slot).unwrap();
        attempts.fetch_add(1, Ordering::Relaxed);
        match rng.random_range(0..10) {
            0..=3 => {
                // A member's name with a wrong secret: refused with a typed answer.
                let secret: Vec<u8> = (0..32).map(|_| rng.random()).collect();
                let wrong = PeerClient::new(
                    &cluster.ids[(i + 1) % NODES],
                    Secret::new(&secret).unwrap(),
                    Duration::from_secs(2),
                    Duration::from_secs(2),
                );
                let member =
                    Member { id: cluster.ids[i].clone(), address: cluster.addresses[i].clone(), weight: 1.0 };
                if let Err(PeerError::Unreachable { why, .. }) = rt.block_on(wrong.remote_slots(&member)) {
                    if why.contains("did not prove") {
                        typed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            9 => {
                // A crowd: 200 connections that never speak, held for a second.
                let idle: Vec<_> =
                    (0..200).filter_map(|_| std::net::TcpStream::connect(&address).ok()).collect();
                attempts.fetch_add(idle.len().saturating_sub(1) as u64, Ordering::Relaxed);
                std::thread::sleep(Duration::from_secs(1));
                drop(idle);
            }
            kind => {
                let Ok(mut s) = std::net::TcpStream::connect(&address) else { continue };
                s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                let mut challenge = [0u8; 128];
                let _ = s.read(&mut challenge);
                let bytes: Vec<u8> = match kind {
                    4..=6 => (0..rng.random_range(1..4096)).map(|_| rng.random()).collect(),
                    // A head announcing a message of 2 GiB.
                    7 => vec![0xff, 0xff, 0xff, 0x7f, 0, 0, 0, 0],
                    // A head announcing 16 bytes, then silence: the handshake deadline closes it.
                    _ => vec![16, 0, 0, 0, 0, 0, 0, 0],
                };
                let _ = s.write_all(&bytes);
                let mut rest = Vec::new();
                let _ = s.read_to_end(&mut rest);
            }
        }
    }
}
