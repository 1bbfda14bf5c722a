//! "protocol / 10,000 connections at once" (R2): far more connections than the slot's default
//! `max_connections` are opened at once and held. Every one of them must be either accepted (a
//! Welcome to its Hello) or refused with a typed `Unavailable`; the readers' connections keep being
//! served meanwhile; a client that starts during the flood is served once it is dropped.

use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use memarts_protocol::{frame, ErrorCode, Limits, Response};
use memarts_proxy::config::FleetConfig;

use super::{Subject, CS};
use crate::common::raw::hello;
use crate::report::Row;
use crate::workload::{self, wrong_bytes, Dataset};
use crate::Scale;

const CONNECTIONS: usize = 10_000;
const THREADS: usize = 16;

/// What the flood's connections got.
#[derive(Default)]
struct Counts {
    accepted: u64,
    refused: u64,
    other: Vec<String>,
}

pub fn run(_scale: Scale, data: &Arc<Dataset>) -> Row {
    let mut row = Row::new("protocol", "10,000 connections at once to one slot");
    let started = Instant::now();
    let max = FleetConfig::default().max_connections;
    // The defaults, max_connections included.
    let subject = Subject::start(data, "");
    let sock = subject.sock.clone();
    let (opened, classified) = (Arc::new(Barrier::new(THREADS + 1)), Arc::new(Barrier::new(THREADS + 1)));
    let workers: Vec<_> = (0..THREADS)
        .map(|_| {
            let (sock, opened, classified) = (sock.clone(), opened.clone(), classified.clone());
            std::thread::spawn(move || {
                let deadline = Instant::now() + Duration::from_secs(60);
                let conns: Vec<_> =
                    (0..CONNECTIONS / THREADS).map(|_| connect_within(&sock, deadline)).collect();
                opened.wait();
                let counts = classify(conns.iter());
                classified.wait();
                (counts, conns)
            })
        })
        .collect();
    opened.wait();
    let (flood_at, reads_at) = (Instant::now(), subject.reads());
    // A client that starts now finds no free connection; it is retried until the flood is dropped.
    let late = {
        let client = workload::client(&subject.fleet, CS, Duration::from_secs(30));
        let url = subject.data.url(1);
        std::thread::spawn(move || {
            let t = Instant::now();
            (client.read(&url), t.elapsed())
        })
    };
    classified.wait();
    let (classified_in, reads_during) = (flood_at.elapsed(), subject.reads() - reads_at);
    let mut counts = Counts::default();
    let mut held = Vec::new();
    for w in workers {
        let (c, conns) = w.join().expect("a flood thread panicked");
        counts.accepted += c.accepted;
        counts.refused += c.refused;
        counts.other.extend(c.other);
        held.push(conns);
    }
    std::thread::sleep(Duration::from_millis(500));
    drop(held);
    let dropped_at = flood_at.elapsed();
    let (late_got, late_took) = late.join().expect("the late client panicked");
    match late_got {
        Ok(got) => {
            let want = &subject.data.objects[1].1;
            row.bytes_verified += want.len() as u64;
            row.wrong_bytes += wrong_bytes(&got, want);
        }
        Err(e) => row.violate(format!("a client started during the flood failed: {e}")),
    }

    row.injected = CONNECTIONS as u64;
    row.detected = counts.refused;
    row.expected_errors = counts.refused;
    if !counts.other.is_empty() {
        let first: Vec<_> = counts.other.iter().take(5).cloned().collect();
        row.violate(format!(
            "{} connections were neither welcomed nor refused with a typed Unavailable: {}",
            counts.other.len(),
            first.join("; ")
        ));
    }
    if counts.accepted > u64::from(max) || counts.accepted == 0 {
        row.violate(format!("{} connections accepted with max_connections = {max}", counts.accepted));
    }
    if reads_during == 0 {
        row.violate("the readers completed no read while the flood was held");
    }
    row.note = format!(
        "max_connections = {max} (the default); of {CONNECTIONS} connections opened at once, {} were \
         welcomed, {} refused with a typed Unavailable (detected), {} neither; the readers' pooled \
         connections completed {reads_during} verified reads in the {:.1} s the flood was held; a \
         client started during the flood was served {:.1} s later (the flood was dropped after {:.1} s).",
        counts.accepted,
        counts.refused,
        counts.other.len(),
        classified_in.as_secs_f64(),
        late_took.as_secs_f64(),
        dropped_at.as_secs_f64()
    );
    subject.finish(&mut row);
    row.seconds = started.elapsed().as_secs_f64();
    row
}

/// Connects without ever blocking on a full accept queue: retried until `deadline`.
fn connect_within(path: &Path, deadline: Instant) -> std::io::Result<UnixStream> {
    use nix::errno::Errno;
    use nix::sys::socket::{connect, socket, AddressFamily, SockFlag, SockType, UnixAddr};
    let addr = UnixAddr::new(path)?;
    loop {
        let flags = SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC;
        let fd: OwnedFd = socket(AddressFamily::Unix, SockType::Stream, flags, None)?;
        match connect(fd.as_raw_fd(), &addr) {
            Ok(()) => {
                let s = UnixStream::from(fd);
                s.set_nonblocking(false)?;
                return Ok(s);
            }
            Err(Errno::EAGAIN) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(1)),
            Err(e) => return Err(e.into()),
        }
    }
}

/// Sends each connection a Hello and reads its first answer: a Welcome (accepted), a typed
/// Unavailable (refused), or anything else.
fn classify<'a>(conns: impl Iterator<Item = &'a std::io::Result<UnixStream>>) -> Counts {
    let mut counts = Counts::default();
    for c in conns {
        let mut s = match c {
            Ok(s) => s,
            Err(e) => {
                counts.other.push(format!("connect: {e}"));
                continue;
            }
        };
        // A refused connection may be closed already: the write fails, the refusal is still there.
        let _ = s.write_all(&hello());
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        match frame::read_sync::<Response, _>(&mut s, Limits::RESPONSE) {
            Ok((_, Response::Welcome(_))) => counts.accepted += 1,
            Ok((_, Response::Error(e))) if e.code == ErrorCode::Unavailable => counts.refused += 1,
            Ok((_, other)) => counts.other.push(format!("{other:?}")),
            Err(e) => counts.other.push(e.to_string()),
        }
    }
    counts
}
