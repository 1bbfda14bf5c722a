//! An on-path attacker between peers (S8): a TCP relay (one listener per slot port) in front of a
//! node's peer listeners. It knows the shape of the peer wire but none of its keys: the handshake's
//! frames in clear (the server's challenge and answer, the client's hello, each a checked frame with
//! its payload), then records of `[u16 big-endian length][sealed bytes]` both ways. It keeps a copy of
//! every byte it relays (a packet capture of its own), and, when attacking, hits each connection once
//! with the next attack of [`ATTACKS`] in turn:
//!
//! - `FlipRequest` / `FlipReply`: one byte of the first record that way is inverted;
//! - `ReplayRequest`: the first request record is sent twice;
//! - `ReplayReply` / `ReorderReply`: the first full-size reply record (a chunk's, which more records
//!   of the same frame follow) is sent twice, or held back and sent after the next one;
//! - `InjectRequest`: before the first request, a record of the attacker's own: a `ReadFirst` of
//!   `/etc/passwd` in clear, with a made-up tag.
//!
//! It counts the attacks that fired, by kind.
// Shared by the end-to-end tests and the reliability campaign; each uses a part of it.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use memarts_protocol::peer::{PeerRequest, NOISE_MESSAGE_MAX, NOISE_TAG_LEN};
use memarts_protocol::{frame, FirstRequest};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attack {
    FlipRequest,
    FlipReply,
    ReplayRequest,
    ReplayReply,
    ReorderReply,
    InjectRequest,
}

pub const ATTACKS: [Attack; 6] = [
    Attack::FlipRequest,
    Attack::FlipReply,
    Attack::ReplayRequest,
    Attack::ReplayReply,
    Attack::ReorderReply,
    Attack::InjectRequest,
];

impl Attack {
    pub fn on_requests(self) -> bool {
        matches!(self, Attack::FlipRequest | Attack::ReplayRequest | Attack::InjectRequest)
    }
}

pub struct PeerRelay {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
    shared: Arc<Shared>,
}

struct Shared {
    attacking: bool,
    connections: AtomicU64,
    fired: [AtomicU64; ATTACKS.len()],
    capture: Mutex<Vec<u8>>,
}

impl PeerRelay {
    /// Relays `from` (the address the other nodes dial) to `to` (where the node listens), for each
    /// of `slots` ports; attacks every connection when `attacking`.
    pub fn start(from: &str, to: &str, slots: u32, attacking: bool) -> PeerRelay {
        let stop = Arc::new(AtomicBool::new(false));
        let shared = Arc::new(Shared {
            attacking,
            connections: AtomicU64::new(0),
            fired: Default::default(),
            capture: Mutex::new(Vec::new()),
        });
        let relaying = shared.clone();
        let threads = super::slot_relay::accept_slots(from, to, slots, &stop, move |_, client, upstream| {
            let n = relaying.connections.fetch_add(1, Ordering::Relaxed);
            let attack = relaying.attacking.then(|| ATTACKS[n as usize % ATTACKS.len()]);
            relay(client, upstream, attack, relaying.clone());
        });
        PeerRelay { stop, threads, shared }
    }

    pub fn fired(&self, attack: Attack) -> u64 {
        self.shared.fired[ATTACKS.iter().position(|a| *a == attack).unwrap()].load(Ordering::Relaxed)
    }

    pub fn total_fired(&self) -> u64 {
        self.shared.fired.iter().map(|f| f.load(Ordering::Relaxed)).sum()
    }

    pub fn connections(&self) -> u64 {
        self.shared.connections.load(Ordering::Relaxed)
    }

    /// Every byte relayed so far, both ways.
    pub fn capture(&self) -> Vec<u8> {
        self.shared.capture.lock().unwrap().clone()
    }

    pub fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn relay(client: TcpStream, upstream: &str, attack: Option<Attack>, shared: Arc<Shared>) {
    let Ok(server) = TcpStream::connect(upstream) else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
    let up = attack.filter(|a| a.on_requests());
    let down = attack.filter(|a| !a.on_requests());
    let shared2 = shared.clone();
    std::thread::spawn(move || pump(c2, s2, 1, up, &shared2));
    std::thread::spawn(move || pump(server, client, 2, down, &shared));
}

/// Relays `frames` handshake frames, then records, from `from` to `to` until either side closes,
/// applying `attack` once; then closes both.
fn pump(mut from: TcpStream, mut to: TcpStream, frames: usize, attack: Option<Attack>, shared: &Shared) {
    let _ = pump_records(&mut from, &mut to, frames, attack, shared);
    let _ = from.shutdown(Shutdown::Read);
    let _ = to.shutdown(Shutdown::Read);
}

fn pump_records(
    from: &mut TcpStream,
    to: &mut TcpStream,
    frames: usize,
    mut attack: Option<Attack>,
    shared: &Shared,
) -> std::io::Result<()> {
    let send = |to: &mut TcpStream, bytes: &[u8]| -> std::io::Result<()> {
        shared.capture.lock().unwrap().extend_from_slice(bytes);
        to.write_all(bytes)
    };
    for _ in 0..frames {
        let mut head = [0u8; 8];
        from.read_exact(&mut head)?;
        let message = u32::from_le_bytes(head[..4].try_into().unwrap()) as usize;
        let payload = u32::from_le_bytes(head[4..].try_into().unwrap()) as usize;
        let mut rest = vec![0u8; (message + 4 + payload).min(1 << 20)];
        from.read_exact(&mut rest)?;
        send(to, &[&head[..], &rest].concat())?;
    }
    let fire = |a: Attack| {
        shared.fired[ATTACKS.iter().position(|x| *x == a).unwrap()].fetch_add(1, Ordering::Relaxed)
    };
    // The record sent last this way: what a replay sends again.
    let mut last: Option<Vec<u8>> = None;
    loop {
        let record = read_record(from)?;
        let full = record.len() == 2 + NOISE_MESSAGE_MAX;
        let earlier = last.replace(record.clone());
        match attack {
            Some(a @ (Attack::FlipRequest | Attack::FlipReply)) => {
                attack = None;
                fire(a);
                let mut flipped = record;
                let at = 2 + rand::random::<u32>() as usize % (flipped.len() - 2);
                flipped[at] = !flipped[at];
                send(to, &flipped)?;
            }
            Some(Attack::ReplayRequest) => {
                attack = None;
                fire(Attack::ReplayRequest);
                send(to, &record)?;
                send(to, &record)?;
            }
            // An earlier record in place of the one the reader waits for (sent after it, a copy
            // could sit unread in a connection that is not used again).
            Some(Attack::ReplayReply) if full && earlier.is_some() => {
                attack = None;
                fire(Attack::ReplayReply);
                send(to, earlier.as_deref().unwrap_or_default())?;
                send(to, &record)?;
            }
            Some(Attack::ReorderReply) if full => {
                attack = None;
                let next = read_record(from)?;
                fire(Attack::ReorderReply);
                send(to, &next)?;
                send(to, &record)?;
            }
            Some(Attack::InjectRequest) => {
                attack = None;
                fire(Attack::InjectRequest);
                send(to, &injected())?;
                send(to, &record)?;
            }
            _ => send(to, &record)?,
        }
    }
}

/// One record, its length prefix included.
fn read_record(from: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 2];
    from.read_exact(&mut len)?;
    let mut record = vec![0u8; 2 + u16::from_be_bytes(len) as usize];
    record[..2].copy_from_slice(&len);
    from.read_exact(&mut record[2..])?;
    Ok(record)
}

/// What an attacker without the keys can make: a well-formed request for a local file, in clear,
/// framed as a record with a made-up tag.
fn injected() -> Vec<u8> {
    let request = PeerRequest::ReadFirst(FirstRequest {
        url: "/etc/passwd".into(),
        chunk_size: 1 << 20,
        refresh: false,
    });
    let mut sealed = frame::encode(&request, 0).unwrap();
    sealed.extend_from_slice(&[0u8; NOISE_TAG_LEN]);
    let mut record = (sealed.len() as u16).to_be_bytes().to_vec();
    record.extend_from_slice(&sealed);
    record
}

/// Whether `capture` holds any run of 64 bytes of `plain` (it then holds one of the 32-byte pieces
/// `plain` is cut into, at some offset): each piece's first 8 bytes are looked up at every offset of
/// the capture, then the piece compared whole.
pub fn holds_plaintext(capture: &[u8], plain: &[&[u8]]) -> bool {
    let mut pieces: std::collections::HashMap<u64, Vec<&[u8]>> = Default::default();
    for p in plain {
        for piece in p.chunks_exact(32) {
            pieces.entry(u64::from_le_bytes(piece[..8].try_into().unwrap())).or_default().push(piece);
        }
    }
    capture.windows(32).any(|w| {
        pieces.get(&u64::from_le_bytes(w[..8].try_into().unwrap())).is_some_and(|found| found.contains(&w))
    })
}
