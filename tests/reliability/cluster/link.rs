//! A faulty network link between peers: a TCP relay (one listener per slot port) in front of a node's
//! peer listeners. Each connection it relays is, with some probability, hit once by one fault at a
//! random byte of one direction (within its first 4 KiB of requests or 4 MiB of replies):
//!
//! - `Reset`: both sides get an RST (`SO_LINGER` 0) at that byte;
//! - `Stall`: nothing more is forwarded for a while (past the peer deadline), then relaying goes on;
//! - `Cut`: the bytes up to that one are forwarded, then both sides are closed (a frame cut short);
//! - `Flip`: that byte is inverted and relaying goes on (what a bad NIC or a TCP checksum that
//!   misses would do).
//!
//! It counts the faults that fired, by kind.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rand::{Rng, SeedableRng};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Reset,
    Stall,
    Cut,
    Flip,
}

pub const KINDS: [Kind; 4] = [Kind::Reset, Kind::Stall, Kind::Cut, Kind::Flip];

/// One connection's fault: which, in which direction, at which byte of it.
#[derive(Debug, Clone, Copy)]
struct Plan {
    kind: Kind,
    to_server: bool,
    at: u64,
}

pub struct FaultyLink {
    stop: Arc<AtomicBool>,
    /// Fired faults, indexed like [`KINDS`].
    pub fired: Arc<[AtomicU64; 4]>,
    pub connections: Arc<AtomicU64>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl FaultyLink {
    /// Relays `from:from_port + k` to `to:to_port + k` for each of `slots` slots; a connection gets a
    /// fault with probability `p`; a stall lasts `stall`.
    pub fn start(from: &str, to: &str, slots: u32, p: f64, stall: Duration, seed: u64) -> FaultyLink {
        let stop = Arc::new(AtomicBool::new(false));
        let fired: Arc<[AtomicU64; 4]> = Arc::new(Default::default());
        let connections = Arc::new(AtomicU64::new(0));
        // One random stream per slot port, as the faults of each port's connections are drawn in turn.
        let rngs: Arc<Vec<std::sync::Mutex<rand::rngs::StdRng>>> = Arc::new(
            (0..slots)
                .map(|k| std::sync::Mutex::new(rand::rngs::StdRng::seed_from_u64(seed + u64::from(k))))
                .collect(),
        );
        let (counted, faults) = (connections.clone(), fired.clone());
        let threads =
            crate::common::slot_relay::accept_slots(from, to, slots, &stop, move |k, client, upstream| {
                counted.fetch_add(1, Ordering::Relaxed);
                let plan = {
                    let mut rng = rngs[k as usize].lock().unwrap();
                    rng.random_bool(p).then(|| {
                        let to_server = rng.random_bool(0.25);
                        // Requests are small, replies carry chunks.
                        let at = rng.random_range(0..if to_server { 4u64 << 10 } else { 4 << 20 });
                        Plan { kind: KINDS[rng.random_range(0..KINDS.len())], to_server, at }
                    })
                };
                relay(client, upstream, plan, stall, faults.clone());
            });
        FaultyLink { stop, fired, connections, threads }
    }

    pub fn fired(&self, kind: Kind) -> u64 {
        self.fired[KINDS.iter().position(|k| *k == kind).unwrap()].load(Ordering::Relaxed)
    }

    pub fn total_fired(&self) -> u64 {
        self.fired.iter().map(|f| f.load(Ordering::Relaxed)).sum()
    }

    pub fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn relay(client: TcpStream, upstream: &str, plan: Option<Plan>, stall: Duration, fired: Arc<[AtomicU64; 4]>) {
    let Ok(server) = TcpStream::connect(upstream) else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
    let up_plan = plan.filter(|p| p.to_server);
    let down_plan = plan.filter(|p| !p.to_server);
    let f2 = fired.clone();
    std::thread::spawn(move || pump(c2, s2, up_plan, stall, f2));
    std::thread::spawn(move || pump(server, client, down_plan, stall, fired));
}

/// Copies `from` to `to` until either side closes, applying `plan` at its byte; then closes both.
fn pump(
    mut from: TcpStream,
    mut to: TcpStream,
    plan: Option<Plan>,
    stall: Duration,
    fired: Arc<[AtomicU64; 4]>,
) {
    let mut buf = vec![0u8; 64 << 10];
    let mut offset = 0u64;
    let mut pending = plan;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let chunk = &mut buf[..n];
        if let Some(p) = pending.filter(|p| p.at < offset + n as u64) {
            pending = None;
            fired[KINDS.iter().position(|k| *k == p.kind).unwrap()].fetch_add(1, Ordering::Relaxed);
            let i = (p.at - offset) as usize;
            match p.kind {
                Kind::Flip => chunk[i] = !chunk[i],
                Kind::Stall => {
                    if to.write_all(&chunk[..i]).is_err() {
                        break;
                    }
                    std::thread::sleep(stall);
                    if to.write_all(&chunk[i..]).is_err() {
                        break;
                    }
                    offset += n as u64;
                    continue;
                }
                Kind::Cut => {
                    let _ = to.write_all(&chunk[..i]);
                    break;
                }
                Kind::Reset => {
                    let _ = to.write_all(&chunk[..i]);
                    reset(&from);
                    reset(&to);
                    break;
                }
            }
        }
        if to.write_all(chunk).is_err() {
            break;
        }
        offset += n as u64;
    }
    // Wakes the other direction's pump (its read returns 0); the sockets close when both pumps have
    // dropped them: a FIN, or an RST after `reset`.
    let _ = from.shutdown(Shutdown::Read);
    let _ = to.shutdown(Shutdown::Read);
}

/// Makes the next close of `stream` an RST.
fn reset(stream: &TcpStream) {
    let linger = nix::libc::linger { l_onoff: 1, l_linger: 0 };
    let _ = nix::sys::socket::setsockopt(stream, nix::sys::socket::sockopt::Linger, &linger);
}
