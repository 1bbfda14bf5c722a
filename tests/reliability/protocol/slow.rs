//! "protocol / slow and stuck clients" (R2): clients that send a byte a second (before and after
//! the handshake), say nothing at all, idle after the handshake, or pipeline requests and never read
//! a reply. Each must be cut off within a bound set by the slot's I/O or idle timeout, while the
//! readers are served as usual.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use memarts_protocol::{frame, Request, Response};

use super::{responses_until, End, Subject};
use crate::common::raw::{hello, read_response};
use crate::report::Row;
use crate::workload::Dataset;
use crate::Scale;

const IO_TIMEOUT: Duration = Duration::from_secs(1);
const IDLE_TIMEOUT: Duration = Duration::from_secs(3);
/// Allowed beyond the timeout that cuts a client: the proxy's half-second linger after a refusal,
/// the client's one-second step, scheduling.
const SLACK: Duration = Duration::from_secs(3);
/// A client still connected this long after it started misbehaving was never cut off.
const GIVE_UP: Duration = Duration::from_secs(15);

#[derive(Debug, Clone, Copy)]
enum Kind {
    /// Sends its Hello a byte a second.
    TrickleHello,
    /// Shakes hands, then sends a request a byte a second.
    TrickleRequest,
    /// Connects and sends nothing.
    Silent,
    /// Shakes hands, then sends nothing.
    Idle,
    /// Shakes hands, then pipelines requests and never reads a reply.
    NeverReads,
}

const KINDS: [Kind; 5] =
    [Kind::TrickleHello, Kind::TrickleRequest, Kind::Silent, Kind::Idle, Kind::NeverReads];

impl Kind {
    /// How soon the slot must have cut this client off.
    fn bound(self) -> Duration {
        match self {
            Kind::Idle => IDLE_TIMEOUT + SLACK,
            _ => IO_TIMEOUT + SLACK,
        }
    }
}

/// When a client was cut off (since it started misbehaving) and whether it got a typed error first.
struct Cut {
    kind: Kind,
    after: Option<Duration>,
    typed: bool,
}

pub fn run(scale: Scale, data: &Arc<Dataset>) -> Row {
    let (per_kind, waves) = (scale.pick(3, 12), scale.pick(1, 5));
    let mut row =
        Row::new("protocol", "slow and stuck clients (a byte a second, silent, idle, never reading)");
    let started = Instant::now();
    let subject = Subject::start(
        data,
        &format!(
            "io_timeout_secs = {}\nidle_timeout_secs = {}\n",
            IO_TIMEOUT.as_secs_f64(),
            IDLE_TIMEOUT.as_secs_f64()
        ),
    );
    let reads_before = subject.reads();
    let mut cuts = Vec::new();
    for _ in 0..waves {
        let clients: Vec<_> = KINDS
            .iter()
            .flat_map(|&k| std::iter::repeat_n(k, per_kind))
            .map(|kind| {
                let sock = subject.sock.clone();
                std::thread::spawn(move || misbehave(&sock, kind))
            })
            .collect();
        cuts.extend(clients.into_iter().map(|c| c.join().expect("a slow client panicked")));
    }
    let reads_during = subject.reads() - reads_before;
    row.injected = cuts.len() as u64;
    let mut late = Vec::new();
    let mut worst = [Duration::ZERO; KINDS.len()];
    for c in &cuts {
        match c.after {
            Some(t) if t <= c.kind.bound() => {
                row.detected += 1;
                let w = &mut worst[c.kind as usize];
                *w = (*w).max(t);
            }
            Some(t) => late.push(format!("{:?} cut after {t:.1?} (bound {:?})", c.kind, c.kind.bound())),
            None => late.push(format!("{:?} still connected after {GIVE_UP:?}", c.kind)),
        }
        row.expected_errors += u64::from(c.typed);
    }
    if !late.is_empty() {
        row.violate(format!("{} clients not cut off in time: {}", late.len(), late.join("; ")));
    }
    let worst: Vec<String> =
        KINDS.iter().map(|&k| format!("{k:?} {:.1} s", worst[k as usize].as_secs_f64())).collect();
    row.note = format!(
        "io_timeout {IO_TIMEOUT:?}, idle_timeout {IDLE_TIMEOUT:?}; {waves} wave(s) of {per_kind} clients of each \
         of {} kinds; detected = clients cut off within the bound (timeout + {SLACK:?}); slowest cut per \
         kind: {}; typed errors = the 'did not arrive in time' refusals the trickling and silent clients \
         got before the close. The readers completed {reads_during} reads meanwhile.",
        KINDS.len(),
        worst.join(", ")
    );
    subject.finish(&mut row);
    row.seconds = started.elapsed().as_secs_f64();
    row
}

fn connect(sock: &Path) -> UnixStream {
    UnixStream::connect(sock).expect("connect to the slot")
}

fn handshake(s: &mut UnixStream) {
    s.write_all(&hello()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    assert!(matches!(read_response(s), Some(Response::Welcome(_))), "a valid Hello was not welcomed");
}

fn misbehave(sock: &Path, kind: Kind) -> Cut {
    let mut s = connect(sock);
    let status = frame::encode(&Request::Status, 0).unwrap();
    if !matches!(kind, Kind::TrickleHello | Kind::Silent) {
        handshake(&mut s);
    }
    let t0 = Instant::now();
    let cut = |got: &[Response], end: End| Cut {
        kind,
        after: (end == End::Closed).then(|| t0.elapsed()),
        typed: got.iter().any(|r| matches!(r, Response::Error(_))),
    };
    match kind {
        Kind::Silent | Kind::Idle => {
            let (got, end) = responses_until(&mut s, t0 + GIVE_UP);
            cut(&got, end)
        }
        Kind::TrickleHello | Kind::TrickleRequest => {
            let bytes = if matches!(kind, Kind::TrickleHello) { hello() } else { status };
            let mut seen = Vec::new();
            for b in bytes.iter().cycle() {
                if t0.elapsed() > GIVE_UP {
                    return cut(&seen, End::TimedOut);
                }
                if s.write_all(&[*b]).is_err() {
                    return cut(&seen, End::Closed);
                }
                // Watch for the cut for a second before the next byte.
                let (got, end) = responses_until(&mut s, Instant::now() + Duration::from_secs(1));
                seen.extend(got);
                if end != End::TimedOut {
                    return cut(&seen, end);
                }
            }
            unreachable!("cycle never ends")
        }
        Kind::NeverReads => {
            // The proxy's replies fill the socket; its write times out and it lets go. Until then our
            // own writes block once it stops reading; afterwards they fail.
            s.set_write_timeout(Some(GIVE_UP)).unwrap();
            loop {
                match s.write_all(&status) {
                    Ok(()) if t0.elapsed() < GIVE_UP => {}
                    Ok(()) => return cut(&[], End::TimedOut),
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                        ) =>
                    {
                        return cut(&[], End::TimedOut)
                    }
                    Err(_) => return cut(&[], End::Closed),
                }
            }
        }
    }
}
