//! "security / another uid and hostile keys" (S1, S3): clients run under `setpriv` as uid 65534 are
//! refused before any frame of theirs is parsed (whatever they send); keys with `..`, NUL, 1 MiB,
//! invalid UTF-8 and absolute paths, sent through the shim and raw, get typed errors or stay inside
//! the cache, and nothing appears outside the cache and run dirs.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use memarts_protocol::{frame, ErrorCode, Limits, Request, Response};
use rand::{Rng, SeedableRng};

use super::{Subject, CS};
use crate::common::files::files_below;
use crate::common::moto;
use crate::common::raw::{as_other_user, hello, open_to_other_users, read_response, OTHER_UID};
use crate::report::Row;
use crate::workload::{self, Dataset};
use crate::Scale;

const THREADS: usize = 8;

pub fn run(scale: Scale, data: &Arc<Dataset>) -> Row {
    let mut row = Row::new("security", "another uid (setpriv 65534), hostile keys");
    let started = Instant::now();
    let subject = Subject::start(data, "");
    let uid_note = other_uid(&subject, scale.pick(20, 200), &mut row);
    let key_note = hostile_keys(&subject, &mut row);
    row.note = format!("{uid_note} {key_note}");
    subject.finish(&mut row);
    row.seconds = started.elapsed().as_secs_f64();
    row
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

/// What the other user sends on attempt `i`: never anything the proxy may parse.
fn other_user_bytes(i: usize) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(i as u64);
    match i % 4 {
        0 => hello(),
        1 => [hello(), frame::encode(&Request::Status, 0).unwrap()].concat(),
        // A head the proxy would refuse as too large, if it read it.
        2 => vec![0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0],
        _ => (0..rng.random_range(1..512)).map(|_| rng.random()).collect(),
    }
}

/// S1: the run dir and socket keep other users out; opened up, the peer-credential check does.
fn other_uid(subject: &Subject, attempts: usize, row: &mut Row) -> String {
    let (run_mode, sock_mode) = (mode(&subject.fleet.run_dir), mode(&subject.sock));
    if run_mode != 0o700 || sock_mode != 0o600 {
        row.violate(format!("run dir {run_mode:o} and socket {sock_mode:o}, not 0700 and 0600"));
    }
    row.injected += 1;
    match as_other_user(&subject.sock, &hello()) {
        Err(libc::EACCES) => row.detected += 1,
        other => row.violate(format!("uid {OTHER_UID} reached the socket through a 0700 run dir: {other:?}")),
    }
    let sock = open_to_other_users(&subject.fleet);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let workers: Vec<_> = (0..THREADS)
        .map(|_| {
            let (sock, next) = (sock.clone(), next.clone());
            std::thread::spawn(move || {
                let mut wrong = Vec::new();
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if i >= attempts {
                        return wrong;
                    }
                    if let Err(e) = refused_only(&sock, &other_user_bytes(i)) {
                        wrong.push(format!("attempt {i}: {e}"));
                    }
                }
            })
        })
        .collect();
    let wrong: Vec<String> =
        workers.into_iter().flat_map(|w| w.join().expect("a uid client panicked")).collect();
    row.injected += attempts as u64;
    row.detected += (attempts - wrong.len()) as u64;
    row.expected_errors += (attempts - wrong.len()) as u64;
    if !wrong.is_empty() {
        row.violate(format!("{} attempts of uid {OTHER_UID} not refused: {}", wrong.len(), wrong.join("; ")));
    }
    format!(
        "Run dir {run_mode:o}, socket {sock_mode:o}: uid {OTHER_UID} could not connect (EACCES); with both opened \
         up, {attempts} attempts (a Hello, a Hello and a request, an oversized head, random bytes) each got \
         exactly one typed PermissionDenied and a close: nothing they sent was parsed."
    )
}

/// Exactly one PermissionDenied frame, then the close.
fn refused_only(sock: &Path, bytes: &[u8]) -> Result<(), String> {
    let got = as_other_user(sock, bytes).map_err(|e| format!("connect failed, errno {e}"))?;
    let mut r: &[u8] = &got;
    match frame::read_sync::<Response, _>(&mut r, Limits::RESPONSE) {
        Ok((_, Response::Error(e))) if e.code == ErrorCode::PermissionDenied && r.is_empty() => Ok(()),
        Ok((_, resp)) => Err(format!("{resp:?} with {} more bytes", r.len())),
        Err(e) => Err(format!("{e} ({} bytes)", got.len())),
    }
}

/// How one hostile request ended.
#[derive(Default)]
struct KeyTally {
    typed: u64,
    /// Closed without an answer: a frame over the size limit whose refusal was lost with the close.
    closed: u64,
    accepted: u64,
    untyped: Vec<String>,
}

/// S3: hostile keys through the shim and raw. Every escape the keys try points into `outside`, a
/// directory next to the cache dir, and the whole fleet dir is walked before and after.
fn hostile_keys(subject: &Subject, row: &mut Row) -> String {
    let fleet = &subject.fleet;
    let outside = fleet.dir.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let before = files_below(fleet.dir.path());
    let bucket = moto().bucket("keys");
    let out = outside.display().to_string();
    let climb = "../".repeat(24);
    let urls = [
        format!("s3://{bucket}/../../outside/escaped"),
        format!("s3://{bucket}/a/../../../outside/escaped"),
        format!("s3://{bucket}/{climb}{}/escaped", out.trim_start_matches('/')),
        format!("s3://{bucket}/{out}/escaped"),
        format!("s3://{bucket}//{out}/escaped"),
        format!("s3://../{climb}{}/escaped", out.trim_start_matches('/')),
        format!("s3://{bucket}/%2e%2e/%2e%2e/outside/escaped"),
        format!("s3://{bucket}/a\0b"),
        format!("s3://{bucket}/{}", "k".repeat(1 << 20)),
        format!("file://{}/../outside/escaped", fleet.cache_dir.display()),
        format!("{}/../outside/escaped", fleet.cache_dir.display()),
        "s3:///no-bucket".to_string(),
        "gopher://host/x".to_string(),
    ];
    let mut t = KeyTally::default();
    let client = workload::client(fleet, CS, Duration::from_secs(10));
    for url in &urls {
        let short: String = url.chars().take(60).collect();
        let mut note = |what: &str, r: Result<(), memarts_shim::Error>| match r {
            Ok(()) => t.accepted += 1,
            Err(e) if e.code().is_some_and(|c| c != ErrorCode::Unavailable) => t.typed += 1,
            Err(e) => t.untyped.push(format!("{what} {short:?}: {e}")),
        };
        note("stat", client.stat(url).map(drop));
        note("read", client.read(url).map(drop));
        note("write_memarts", client.put_memarts_bytes(url, b"hostile").map(drop));
        let mut sink = memarts_shim::VecSink::default();
        note("read_memarts", client.read_memarts_to(url, &mut sink).map(drop));
        if url.starts_with("s3://") {
            // Local paths are the local origin's to write and delete; keys at the S3 origin are not.
            note("write", client.put_bytes(url, b"hostile").map(drop));
            note("delete", client.delete(url));
        }
    }
    // What the shim refuses itself (NUL, 1 MiB, not UTF-8) must be refused by the proxy too.
    let raw_urls = [format!("s3://{bucket}/a\0b"), format!("s3://{bucket}/{}", "k".repeat(1 << 20))];
    let mut raw = 0;
    for url in &raw_urls {
        for request in [
            Request::Stat { url: url.clone(), refresh: false },
            Request::PutMemartsStart { url: url.clone() },
            Request::ReadMemarts { url: url.clone() },
            Request::Delete { url: url.clone() },
        ] {
            raw += 1;
            raw_ask(&subject.sock, &frame::encode(&request, 0).unwrap(), &mut t);
        }
    }
    for request in [
        Request::Stat { url: "s3://b/AAAA".into(), refresh: false },
        Request::PutMemartsStart { url: "s3://b/AAAA".into() },
    ] {
        let mut bytes = frame::encode(&request, 0).unwrap();
        let at = bytes.windows(4).position(|w| w == b"AAAA").unwrap();
        bytes[at..at + 4].copy_from_slice(&[0xff, 0xfe, 0xc0, 0x80]);
        raw += 1;
        raw_ask(&subject.sock, &bytes, &mut t);
    }
    let created: Vec<PathBuf> = files_below(fleet.dir.path())
        .into_iter()
        .filter(|p| !before.contains(p) && !p.starts_with(&fleet.cache_dir) && !p.starts_with(&fleet.run_dir))
        .collect();
    if !created.is_empty() {
        row.violate(format!("hostile keys created files outside the cache: {created:?}"));
    }
    if !t.untyped.is_empty() {
        row.violate(format!(
            "{} hostile requests without a typed answer: {}",
            t.untyped.len(),
            t.untyped.join("; ")
        ));
    }
    let sent = t.typed + t.closed + t.accepted + t.untyped.len() as u64;
    row.injected += sent;
    row.detected += t.typed + t.closed;
    row.expected_errors += t.typed;
    format!(
        "{sent} hostile-key requests ({} URLs through the shim: stat, read, write_memarts, read_memarts, and for \
         s3 keys write and delete; {raw} raw frames with NUL, 1 MiB and invalid UTF-8 keys the shim refuses \
         itself): {} typed errors and {} closes (detected), {} accepted as odd but valid keys, kept inside the cache; \
         {} files appeared outside the cache and run dirs.",
        urls.len(),
        t.typed,
        t.closed,
        t.accepted,
        created.len()
    )
}

/// Sends one raw request after a Hello: a typed error, or a close for a frame over the size limit.
fn raw_ask(sock: &Path, request: &[u8], t: &mut KeyTally) {
    let mut s = UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(&hello()).unwrap();
    assert!(matches!(read_response(&mut s), Some(Response::Welcome(_))));
    let oversized = request.len() > Limits::REQUEST.max_message as usize;
    // A frame over the size limit is refused from its head: the rest of it may meet a closed socket.
    let _ = s.write_all(request);
    match read_response(&mut s) {
        Some(Response::Error(_)) => t.typed += 1,
        None if oversized => t.closed += 1,
        other => t.untyped.push(format!("raw request of {} bytes: {other:?}", request.len())),
    }
}
