//! "protocol / raw-socket fuzzer" (S2, I6): one connection per mutated frame. Every request kind is
//! encoded validly, then mutated with a seeded RNG (bit flips, bytes inserted or deleted, truncation,
//! huge length prefixes, wrong protocol versions, trailing garbage, pure random bytes, a valid frame
//! followed by garbage, unknown variants, lengths off by a few, a payload where none belongs) and
//! sent after a valid Hello. The connection must end in a bounded, typed way: responses, a typed
//! error then a close, or a close; never a hang.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use memarts_protocol::{
    frame, ChunkRequest, FirstRequest, Hello, Limits, ListRequest, Request, Response, FRAME_HEAD_LEN,
    PROTOCOL_VERSION,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{responses_until, End, Subject};
use crate::common::raw::hello;
use crate::common::{moto, pattern};
use crate::report::Row;
use crate::workload::{self, Dataset};
use crate::Scale;

const SEED: u64 = 0x6675_7a7a;
/// The proxy's I/O timeout in this row: a frame held open half-sent is refused after it.
const IO_TIMEOUT: Duration = Duration::from_secs(1);
/// A connection that has not ended this long after its last byte was sent hangs. Generous: a
/// mutated request that is still valid may go to the origin, with retries.
const HANG: Duration = Duration::from_secs(20);
/// Of the connections, 1 in this many keeps its write side open after the mutated frame (the proxy
/// must end a half-sent frame by its I/O timeout); the others shut it down.
const HOLD_OPEN_ONE_IN: u32 = 8;
const THREADS: usize = 32;

const KINDS: [&str; 12] = [
    "bit flips",
    "bytes inserted",
    "bytes deleted",
    "truncation",
    "huge length prefix",
    "wrong protocol version",
    "trailing garbage in the message",
    "pure random bytes",
    "valid frame + garbage",
    "unknown variant",
    "length off by a few",
    "payload where none belongs",
];
const WRONG_VERSION: usize = 5;

pub fn run(scale: Scale, data: &Arc<Dataset>) -> Row {
    let n = scale.pick(2_000, 30_000);
    let mut row = Row::new("protocol", "raw-socket fuzzer: one mutated frame per connection");
    let started = Instant::now();
    let subject = Subject::start(
        data,
        &format!(
            "io_timeout_secs = {}\n[origin]\nbackoff_base_ms = 20\nbackoff_max_ms = 300\n",
            IO_TIMEOUT.as_secs_f64()
        ),
    );
    let templates = Arc::new(templates(&subject));
    let tally = Arc::new(Mutex::new(Fuzzed::default()));
    let (next, dead) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicBool::new(false)));
    let workers: Vec<_> = (0..THREADS)
        .map(|_| {
            let (templates, tally, next, dead) =
                (templates.clone(), tally.clone(), next.clone(), dead.clone());
            let sock = subject.sock.clone();
            std::thread::spawn(move || loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n || dead.load(Ordering::Relaxed) {
                    return;
                }
                let outcome = one(&sock, &templates, i);
                if matches!(outcome.result, Fuzz::NoConnect(_)) {
                    dead.store(true, Ordering::Relaxed);
                }
                tally.lock().unwrap().add(outcome);
            })
        })
        .collect();
    for w in workers {
        w.join().expect("a fuzzer thread panicked");
    }
    let t = tally.lock().unwrap();
    row.injected = t.sent;
    row.detected = t.typed + t.closed;
    row.expected_errors = t.typed;
    let hung = format!("hung past {HANG:?}");
    for (what, list) in [(hung.as_str(), &t.hangs), ("got bytes that are no response frame", &t.garbled)] {
        if !list.is_empty() {
            row.violate(format!("{} connections {what}: {}", list.len(), first(list)));
        }
    }
    if !t.unwelcome.is_empty() {
        row.violate(format!("{} valid Hellos not welcomed: {}", t.unwelcome.len(), first(&t.unwelcome)));
    }
    if let Some(e) = &t.no_connect {
        row.violate(format!("could not connect to the slot any more: {e}"));
    }
    let codes: Vec<String> = t.codes.iter().map(|(c, k)| format!("{k} {c}")).collect();
    row.note = format!(
        "{n} connections (seed {SEED:#x}), each a valid Hello then one mutated frame of one of {} request \
         kinds ({}); 1 in {HOLD_OPEN_ONE_IN} kept its write side open. detected = {} typed error frames \
         ({}) + {} closes without a frame; {} got valid responses (the mutation left a valid request); \
         0 may hang past {HANG:?}, the slowest took {:.2} s.",
        templates.len(),
        KINDS.join(", "),
        t.typed,
        codes.join(", "),
        t.closed,
        t.answered,
        t.slowest.as_secs_f64()
    );
    drop(t);
    subject.finish(&mut row);
    row.seconds = started.elapsed().as_secs_f64();
    row
}

/// The first few of a list, for a violation.
fn first(list: &[String]) -> String {
    list.iter().take(10).cloned().collect::<Vec<_>>().join("; ")
}

/// A valid frame of every request kind, aimed at a bucket of its own (a mutated Delete or PutStart
/// never touches the readers' data): existing objects, so that some mutants are answered.
fn templates(subject: &Subject) -> Vec<Vec<u8>> {
    let bucket = moto().bucket("fuzz");
    let body = pattern(4242, 100_000);
    moto().put(&bucket, "f/obj", &body);
    let url = format!("s3://{bucket}/f/obj");
    let client = workload::client(&subject.fleet, super::CS, Duration::from_secs(30));
    let etag = client.stat(&url).expect("stat the fuzz object").etag.unwrap_or_default();
    let only = format!("s3://{bucket}/only/x");
    client.put_memarts_bytes(&only, &body[..5000]).expect("write a memarts-only object");
    let chunk = |index| ChunkRequest {
        url: url.clone(),
        etag: etag.clone(),
        object_size: body.len() as u64,
        chunk_size: 64 << 10,
        index,
        recheck: false,
    };
    let requests = vec![
        Request::Hello(Hello { protocol_version: PROTOCOL_VERSION, client: "fuzz".into() }),
        Request::Stat { url: url.clone(), refresh: false },
        Request::ReadChunk(chunk(0)),
        Request::List(ListRequest {
            url: format!("s3://{bucket}/f/"),
            recursive: true,
            start_after: None,
            max_entries: 100,
        }),
        Request::Status,
        Request::ReadFirst(FirstRequest { url: url.clone(), chunk_size: 64 << 10, refresh: false }),
        Request::ReadChunks(vec![chunk(0), chunk(1)]),
        Request::PutStart { url: format!("s3://{bucket}/f/new") },
        Request::PutData,
        Request::PutFinish { size: 5, crc32c: 7 },
        Request::Delete { url: format!("s3://{bucket}/f/gone") },
        Request::PutMemartsStart { url: format!("s3://{bucket}/only/new") },
        Request::ReadMemarts { url: only },
    ];
    requests
        .iter()
        .map(|r| {
            let payload = if matches!(r, Request::PutData) { 100 } else { 0 };
            let mut f = frame::encode(r, payload).unwrap();
            f.extend(pattern(9, payload));
            f
        })
        .collect()
}

/// The bytes one connection sends: whether a valid Hello goes first, then the mutant.
struct Mutant {
    hello_first: bool,
    bytes: Vec<u8>,
    kind: usize,
    /// Keep the write side open after the mutant.
    hold: bool,
}

fn random_bytes(rng: &mut StdRng, n: usize) -> Vec<u8> {
    (0..n).map(|_| rng.random()).collect()
}

fn set_u32(f: &mut Vec<u8>, at: usize, v: u32) {
    if f.len() < at + 4 {
        f.resize(at + 4, 0);
    }
    f[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn get_u32(f: &[u8], at: usize) -> u32 {
    f.get(at..at + 4).map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

/// Whether mutation `kind` can be applied to `f` (a second mutation meets an already mutated frame).
fn applicable(kind: usize, f: &[u8]) -> bool {
    match kind {
        0 | 2 | 3 => !f.is_empty(),
        6 => f.len() >= FRAME_HEAD_LEN + get_u32(f, 0) as usize,
        9 => f.len() > FRAME_HEAD_LEN,
        WRONG_VERSION => false,
        _ => true,
    }
}

/// Applies mutation `kind` to `f`.
fn mutate(rng: &mut StdRng, f: &mut Vec<u8>, kind: usize) {
    let len = f.len();
    match kind {
        0 => {
            for _ in 0..rng.random_range(1..=8) {
                let at = rng.random_range(0..len);
                f[at] ^= 1 << rng.random_range(0..8);
            }
        }
        1 => {
            let at = rng.random_range(0..=len);
            let n = rng.random_range(1..=16);
            f.splice(at..at, random_bytes(rng, n));
        }
        2 => {
            let at = rng.random_range(0..len);
            let n = rng.random_range(1..=16).min(len - at);
            f.drain(at..at + n);
        }
        3 => f.truncate(rng.random_range(0..len)),
        4 => {
            let limits = Limits::REQUEST;
            let huge = [u32::MAX, 1 << 31, limits.max_message + 1, limits.max_payload + 1, rng.random()];
            let v = huge[rng.random_range(0..huge.len())];
            set_u32(f, if rng.random_bool(0.5) { 0 } else { 4 }, v);
        }
        6 => {
            let n = rng.random_range(1..=32);
            let m = get_u32(f, 0) as usize;
            f.splice(FRAME_HEAD_LEN + m..FRAME_HEAD_LEN + m, random_bytes(rng, n));
            set_u32(f, 0, (m + n) as u32);
        }
        7 => {
            let n = rng.random_range(1..=256);
            *f = random_bytes(rng, n);
        }
        8 => {
            let n = rng.random_range(1..=64);
            f.extend(random_bytes(rng, n));
        }
        9 => f[FRAME_HEAD_LEN] = rng.random_range(14..=255),
        10 => {
            let m = get_u32(f, 0) as i64 + [-4, -3, -2, -1, 1, 2, 3, 4][rng.random_range(0..8)];
            set_u32(f, 0, m.max(0) as u32);
        }
        11 => {
            let n = rng.random_range(1..=4096);
            set_u32(f, 4, n as u32);
            f.extend(random_bytes(rng, n as usize));
        }
        _ => unreachable!("mutation {kind}"),
    }
}

/// The mutant of connection `i`, the same for the same seed.
fn mutant(templates: &[Vec<u8>], i: usize) -> Mutant {
    let mut rng = StdRng::seed_from_u64(SEED.wrapping_mul(0x9E37_79B9).wrapping_add(i as u64));
    let t = rng.random_range(0..templates.len());
    let kind = rng.random_range(0..KINDS.len());
    let mut bytes = templates[t].clone();
    if kind == WRONG_VERSION {
        // The opening Hello itself speaks another version; the template follows it.
        let versions = [0, PROTOCOL_VERSION + 1, u32::MAX, rng.random_range(2..u32::MAX)];
        let v = versions[rng.random_range(0..versions.len())];
        let mut f =
            frame::encode(&Request::Hello(Hello { protocol_version: v, client: "fuzz".into() }), 0).unwrap();
        f.extend(bytes);
        return Mutant { hello_first: false, bytes: f, kind, hold: rng.random_ratio(1, HOLD_OPEN_ONE_IN) };
    }
    mutate(&mut rng, &mut bytes, kind);
    if rng.random_bool(0.25) {
        let second = rng.random_range(0..KINDS.len());
        if applicable(second, &bytes) {
            mutate(&mut rng, &mut bytes, second);
        }
    }
    // A mutated Hello is sent as the opening frame half the time, else as a second Hello.
    let hello_first = t != 0 || rng.random_bool(0.5);
    Mutant { hello_first, bytes, kind, hold: rng.random_ratio(1, HOLD_OPEN_ONE_IN) }
}

enum Fuzz {
    Answered,
    Typed(String),
    Closed,
    Hung,
    Garbled,
    Unwelcome(String),
    NoConnect(String),
}

struct Outcome {
    i: usize,
    kind: usize,
    took: Duration,
    result: Fuzz,
}

/// One connection: connect, Hello, the mutant, then read until the proxy closes.
fn one(sock: &std::path::Path, templates: &[Vec<u8>], i: usize) -> Outcome {
    let m = mutant(templates, i);
    let out = |result, took| Outcome { i, kind: m.kind, took, result };
    let mut s = match UnixStream::connect(sock) {
        Ok(s) => s,
        Err(e) => return out(Fuzz::NoConnect(e.to_string()), Duration::ZERO),
    };
    s.set_write_timeout(Some(HANG)).unwrap();
    if m.hello_first {
        let _ = s.write_all(&hello());
        match responses_first(&mut s) {
            Some(Response::Welcome(_)) => {}
            other => return out(Fuzz::Unwelcome(format!("#{i}: {other:?}")), Duration::ZERO),
        }
    }
    let _ = s.write_all(&m.bytes); // the proxy may close before taking all of it
    let t0 = Instant::now();
    let (mut got, mut end) = (Vec::new(), End::TimedOut);
    if m.hold {
        (got, end) = responses_until(&mut s, Instant::now() + IO_TIMEOUT + Duration::from_millis(1500));
    }
    if end == End::TimedOut {
        let _ = s.shutdown(std::net::Shutdown::Write);
        let (more, e) = responses_until(&mut s, Instant::now() + HANG);
        got.extend(more);
        end = e;
    }
    let took = t0.elapsed();
    let result = match end {
        End::TimedOut => Fuzz::Hung,
        End::Garbled => Fuzz::Garbled,
        End::Closed => match got.iter().find_map(typed) {
            Some(code) => Fuzz::Typed(code),
            None if got.is_empty() => Fuzz::Closed,
            None => Fuzz::Answered,
        },
    };
    out(result, took)
}

fn responses_first(s: &mut UnixStream) -> Option<Response> {
    s.set_read_timeout(Some(HANG)).unwrap();
    crate::common::raw::read_response(s)
}

/// The code of a typed refusal.
fn typed(r: &Response) -> Option<String> {
    match r {
        Response::Error(e) => Some(format!("{:?}", e.code)),
        Response::Incompatible { .. } => Some("Incompatible".into()),
        _ => None,
    }
}

#[derive(Default)]
struct Fuzzed {
    sent: u64,
    typed: u64,
    closed: u64,
    answered: u64,
    codes: BTreeMap<String, u64>,
    slowest: Duration,
    hangs: Vec<String>,
    garbled: Vec<String>,
    unwelcome: Vec<String>,
    no_connect: Option<String>,
}

impl Fuzzed {
    fn add(&mut self, o: Outcome) {
        let what = || format!("#{} ({})", o.i, KINDS[o.kind]);
        if !matches!(o.result, Fuzz::NoConnect(_) | Fuzz::Unwelcome(_)) {
            self.sent += 1;
            self.slowest = self.slowest.max(o.took);
        }
        match o.result {
            Fuzz::Answered => self.answered += 1,
            Fuzz::Typed(code) => {
                self.typed += 1;
                *self.codes.entry(code).or_default() += 1;
            }
            Fuzz::Closed => self.closed += 1,
            Fuzz::Hung => self.hangs.push(what()),
            Fuzz::Garbled => self.garbled.push(what()),
            Fuzz::Unwelcome(e) => self.unwelcome.push(e),
            Fuzz::NoConnect(e) => self.no_connect = Some(e),
        }
    }
}
