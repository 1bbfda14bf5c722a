//! A fault-injecting origin for end-to-end tests: an HTTP relay on loopback in front of the real S3
//! server (moto). Proxies reach the origin through it; a test queues faults, each of which hits the
//! next request(s) that match it:
//!
//! - `Status(503)` / `Status(500)`: an S3 error reply (`SlowDown` / `InternalError`), not forwarded;
//! - `Reset`: the connection is reset (RST) once the request has arrived;
//! - `Truncate`: the reply keeps its `Content-Length` but the body stops half way;
//! - `Stall`: the request is read, then nothing is sent back until the fault's time is up;
//! - `WrongRange`: a ranged GET is forwarded for a range shifted by one byte;
//! - `NoETags`: the reply's `<ETag>` elements are taken out (a listing as some S3-compatible
//!   servers send it);
//! - `Replace(f)`: `f` overwrites the object on the server, then the request goes on: it and every
//!   later ranged GET of the same read meet the new version (a read pinned by `If-Match` gets 412).
//!
//! `set_down(true)` makes every connection reset at once (the origin is unreachable),
//! `allow_keys` makes the relay answer 403 `InvalidAccessKeyId` to a request signed with any other
//! access key id (credential rotation), and `rewrite` sends requests for one bucket to another (an
//! impostor's origin that serves other bytes under the same names). Each connection carries one request (`Connection: close`).
// Shared by the end-to-end tests and the reliability campaign; each uses a part of it.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Clone)]
pub enum Fault {
    Status(u16),
    Reset,
    Truncate,
    Stall(Duration),
    WrongRange,
    NoETags,
    /// Runs after the request was served (the test overwrites the object on the server).
    Replace(Arc<dyn Fn() + Send + Sync>),
}

impl std::fmt::Debug for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl Fault {
    pub fn name(&self) -> &'static str {
        match self {
            Fault::Status(503) => "503 SlowDown",
            Fault::Status(_) => "5xx",
            Fault::Reset => "reset",
            Fault::Truncate => "truncated body",
            Fault::Stall(_) => "stall",
            Fault::WrongRange => "wrong range",
            Fault::NoETags => "no ETags",
            Fault::Replace(_) => "replaced mid-read",
        }
    }
}

/// Which requests a fault hits: a method (`GET`, `HEAD`), ranged GETs only, a path substring.
#[derive(Debug, Clone, Default)]
pub struct Match {
    pub method: Option<&'static str>,
    pub ranged: bool,
    pub path_contains: Option<String>,
}

impl Match {
    pub fn any() -> Match {
        Match::default()
    }

    pub fn ranged_get(path_contains: &str) -> Match {
        Match { method: Some("GET"), ranged: true, path_contains: Some(path_contains.to_string()) }
    }

    fn hits(&self, req: &Request) -> bool {
        self.method.is_none_or(|m| m == req.method)
            && (!self.ranged || req.header("range").is_some())
            && self.path_contains.as_deref().is_none_or(|p| req.path.contains(p))
    }
}

struct Rule {
    when: Match,
    fault: Fault,
    left: u32,
}

#[derive(Default)]
struct State {
    rules: Mutex<Vec<Rule>>,
    allowed_keys: Mutex<Option<Vec<String>>>,
    down: AtomicBool,
    stop: AtomicBool,
    requests: AtomicU64,
    injected: AtomicU64,
    /// Requests being served now, and the most at once since `reset_peak`.
    inflight: AtomicU64,
    peak: AtomicU64,
    /// Since `reset_peak`: requests, and the sum of how many were in flight as each arrived.
    arrivals: AtomicU64,
    arrival_load: AtomicU64,
    refused_keys: AtomicU64,
    keys_seen: Mutex<std::collections::BTreeSet<String>>,
    rewrite: Mutex<Option<(String, String)>>,
}

pub struct FaultRelay {
    pub endpoint: String,
    upstream: String,
    state: Arc<State>,
}

impl FaultRelay {
    /// A relay to `upstream` (`http://host:port`), serving until it is dropped.
    pub fn start(upstream: &str) -> FaultRelay {
        let listener = TcpListener::bind("127.0.0.1:0").expect("relay listener");
        let endpoint = format!("http://{}", listener.local_addr().expect("relay address"));
        let state = Arc::new(State::default());
        let upstream = upstream.trim_start_matches("http://").trim_end_matches('/').to_string();
        let (st, up) = (state.clone(), upstream.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if st.stop.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(conn) = conn else { continue };
                let (st, up) = (st.clone(), up.clone());
                std::thread::spawn(move || serve(conn, &up, &st));
            }
        });
        FaultRelay { endpoint, upstream, state }
    }

    /// Queues `fault` for the next `times` requests that match `when`.
    pub fn inject(&self, when: Match, fault: Fault, times: u32) {
        self.state.rules.lock().unwrap().push(Rule { when, fault, left: times });
    }

    /// Faults queued but not yet injected.
    pub fn pending(&self) -> u32 {
        self.state.rules.lock().unwrap().iter().map(|r| r.left).sum()
    }

    /// Faults queued for requests whose path contains `path_contains`.
    pub fn pending_for(&self, path_contains: &str) -> u32 {
        let rules = self.state.rules.lock().unwrap();
        rules
            .iter()
            .filter(|r| r.when.path_contains.as_deref().is_some_and(|p| p.contains(path_contains)))
            .map(|r| r.left)
            .sum()
    }

    pub fn clear(&self) {
        self.state.rules.lock().unwrap().clear();
    }

    pub fn set_down(&self, down: bool) {
        self.state.down.store(down, Ordering::SeqCst);
    }

    /// Only requests signed with one of `keys` are forwarded (`None`: any).
    pub fn allow_keys(&self, keys: Option<Vec<String>>) {
        *self.state.allowed_keys.lock().unwrap() = keys;
    }

    /// Forwards requests whose path starts with `/<from>/` as requests for `/<to>/` (moto does not
    /// check signatures, so the rewritten request is served).
    pub fn rewrite(&self, from: &str, to: &str) {
        *self.state.rewrite.lock().unwrap() = Some((format!("/{from}/"), format!("/{to}/")));
    }

    pub fn requests(&self) -> u64 {
        self.state.requests.load(Ordering::SeqCst)
    }

    /// The most requests the relay served at once since it started (or `reset_peak`).
    pub fn peak_concurrency(&self) -> u64 {
        self.state.peak.load(Ordering::SeqCst)
    }

    /// How many requests were in flight, on average, as each request since `reset_peak` arrived
    /// (itself included).
    pub fn mean_concurrency(&self) -> f64 {
        let n = self.state.arrivals.load(Ordering::SeqCst).max(1);
        self.state.arrival_load.load(Ordering::SeqCst) as f64 / n as f64
    }

    pub fn reset_peak(&self) {
        self.state.peak.store(self.state.inflight.load(Ordering::SeqCst), Ordering::SeqCst);
        self.state.arrivals.store(0, Ordering::SeqCst);
        self.state.arrival_load.store(0, Ordering::SeqCst);
    }

    pub fn injected(&self) -> u64 {
        self.state.injected.load(Ordering::SeqCst)
    }

    /// Every access key id that signed a request so far.
    pub fn keys_seen(&self) -> std::collections::BTreeSet<String> {
        self.state.keys_seen.lock().unwrap().clone()
    }

    pub fn refused_keys(&self) -> u64 {
        self.state.refused_keys.load(Ordering::SeqCst)
    }

    /// Environment for proxies to reach the origin through this relay.
    pub fn env(&self) -> Vec<(String, String)> {
        let mut env = super::moto().env();
        for (k, v) in env.iter_mut() {
            if k == "AWS_ENDPOINT_URL" {
                *v = self.endpoint.clone();
            }
        }
        env
    }

    /// A fleet of `slots` reaching the origin through this relay, with short origin deadlines and
    /// backoff, `extra_toml` settings and `env` on top. The config's dir must outlive the fleet (its
    /// stop reads the same config): it comes first, so it is dropped last.
    pub fn fleet(
        &self,
        slots: u32,
        extra_toml: &str,
        env: &[(&str, &str)],
    ) -> (tempfile::TempDir, super::Fleet) {
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("origin.toml");
        let toml = format!(
            "{extra_toml}\n[origin]\nfirst_byte_timeout_secs = 1.0\nconnect_timeout_secs = 1.0\n\
             backoff_base_ms = 20\nbackoff_max_ms = 300\n"
        );
        std::fs::write(&cfg, toml).unwrap();
        let mut all = self.env();
        all.push(("MEMARTS_CONFIG".into(), cfg.display().to_string()));
        all.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let all: Vec<(&str, &str)> = all.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        (dir, super::Fleet::start(slots, &all))
    }

    pub fn upstream(&self) -> &str {
        &self.upstream
    }
}

impl Drop for FaultRelay {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect(self.endpoint.trim_start_matches("http://"));
    }
}

struct Request {
    method: String,
    path: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Request {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    fn access_key(&self) -> Option<&str> {
        let auth = self.header("authorization")?;
        let cred = auth.split("Credential=").nth(1)?;
        cred.split('/').next()
    }

    /// The request as sent upstream: one request per connection, and `range` instead of its own.
    fn encode(&self, range: Option<&str>) -> Vec<u8> {
        let mut out = format!("{} {} HTTP/1.1\r\n", self.method, self.path).into_bytes();
        for (k, v) in &self.headers {
            if k.eq_ignore_ascii_case("connection") || (range.is_some() && k.eq_ignore_ascii_case("range")) {
                continue;
            }
            out.extend_from_slice(format!("{k}: {v}\r\n").as_bytes());
        }
        if let Some(r) = range {
            out.extend_from_slice(format!("range: {r}\r\n").as_bytes());
        }
        out.extend_from_slice(b"connection: close\r\n\r\n");
        out.extend_from_slice(&self.body);
        out
    }
}

fn read_request(conn: &mut TcpStream) -> Option<Request> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 << 10];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = conn.read(&mut chunk).ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut first = lines.next()?.split(' ');
    let (method, path) = (first.next()?.to_string(), first.next()?.to_string());
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let mut req = Request { method, path, headers, body: buf[head_end..].to_vec() };
    let len: usize = req.header("content-length").and_then(|v| v.parse().ok()).unwrap_or(0);
    while req.body.len() < len {
        let n = conn.read(&mut chunk).ok()?;
        if n == 0 {
            return None;
        }
        req.body.extend_from_slice(&chunk[..n]);
    }
    Some(req)
}

/// Sends `raw` to the upstream server and returns its whole reply (it closes after one request).
fn forward(upstream: &str, raw: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut up = TcpStream::connect(upstream)?;
    up.set_read_timeout(Some(Duration::from_secs(60)))?;
    up.write_all(raw)?;
    let mut reply = Vec::new();
    up.read_to_end(&mut reply)?;
    Ok(reply)
}

fn reset(conn: TcpStream) {
    let _ = nix::sys::socket::setsockopt(
        &conn,
        nix::sys::socket::sockopt::Linger,
        &libc::linger { l_onoff: 1, l_linger: 0 },
    );
    drop(conn);
}

fn s3_error(conn: &mut TcpStream, status: u16, code: &str) {
    let reason = match status {
        403 => "Forbidden",
        500 => "Internal Server Error",
        503 => "Slow Down",
        _ => "Error",
    };
    let body = format!("<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>{code}</Code><Message>injected by the fault relay</Message></Error>");
    let reply = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: application/xml\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = conn.write_all(reply.as_bytes());
}

/// `bytes=a-b` shifted by one byte (down, or up from 0).
fn shifted(range: &str) -> Option<String> {
    let (a, b) = range.strip_prefix("bytes=")?.split_once('-')?;
    let (a, b): (u64, u64) = (a.parse().ok()?, b.parse().ok()?);
    Some(if a > 0 { format!("bytes={}-{}", a - 1, b - 1) } else { format!("bytes={}-{}", a + 1, b + 1) })
}

fn take_fault(st: &State, req: &Request) -> Option<Fault> {
    let mut rules = st.rules.lock().unwrap();
    let rule = rules.iter_mut().find(|r| r.left > 0 && r.when.hits(req))?;
    rule.left -= 1;
    let fault = rule.fault.clone();
    rules.retain(|r| r.left > 0);
    st.injected.fetch_add(1, Ordering::SeqCst);
    Some(fault)
}

fn serve(mut conn: TcpStream, upstream: &str, st: &State) {
    if st.down.load(Ordering::SeqCst) {
        return reset(conn);
    }
    let Some(mut req) = read_request(&mut conn) else { return };
    st.requests.fetch_add(1, Ordering::SeqCst);
    let now = st.inflight.fetch_add(1, Ordering::SeqCst) + 1;
    st.peak.fetch_max(now, Ordering::SeqCst);
    st.arrivals.fetch_add(1, Ordering::SeqCst);
    st.arrival_load.fetch_add(now, Ordering::SeqCst);
    struct Served<'a>(&'a AtomicU64);
    impl Drop for Served<'_> {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::SeqCst);
        }
    }
    let _served = Served(&st.inflight);
    if let Some((from, to)) = st.rewrite.lock().unwrap().as_ref() {
        if let Some(rest) = req.path.strip_prefix(from.as_str()) {
            req.path = format!("{to}{rest}");
        }
    }
    if let Some(k) = req.access_key() {
        st.keys_seen.lock().unwrap().insert(k.to_string());
    }
    if let Some(keys) = st.allowed_keys.lock().unwrap().as_ref() {
        if !req.access_key().is_some_and(|k| keys.iter().any(|a| a == k)) {
            st.refused_keys.fetch_add(1, Ordering::SeqCst);
            return s3_error(&mut conn, 403, "InvalidAccessKeyId");
        }
    }
    let fault = take_fault(st, &req);
    let range = match (&fault, req.header("range")) {
        (Some(Fault::WrongRange), Some(r)) => shifted(r),
        _ => None,
    };
    match &fault {
        Some(Fault::Status(code)) => {
            return s3_error(&mut conn, *code, if *code == 503 { "SlowDown" } else { "InternalError" })
        }
        Some(Fault::Reset) => return reset(conn),
        Some(Fault::Stall(d)) => {
            let until = std::time::Instant::now() + *d;
            while std::time::Instant::now() < until && !st.stop.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(20));
            }
            return reset(conn);
        }
        _ => {}
    }
    if let Some(Fault::Replace(replace)) = &fault {
        // Before this request goes on: it, and every later one, meets the new version (other
        // requests of the same read may already have been served the old one).
        replace();
    }
    let Ok(reply) = forward(upstream, &req.encode(range.as_deref())) else { return reset(conn) };
    match &fault {
        Some(Fault::Truncate) => {
            let head = reply.windows(4).position(|w| w == b"\r\n\r\n").map_or(reply.len(), |i| i + 4);
            let cut = head + (reply.len() - head) / 2;
            let _ = conn.write_all(&reply[..cut]);
            let _ = conn.flush();
            reset(conn);
        }
        Some(Fault::NoETags) => {
            let _ = conn.write_all(&without_etags(&reply));
        }
        _ => {
            let _ = conn.write_all(&reply);
        }
    }
}

/// `reply` (one HTTP/1.1 response with a `Content-Length`) with its body's `<ETag>` elements taken
/// out and its length set to match.
fn without_etags(reply: &[u8]) -> Vec<u8> {
    let head_end = reply.windows(4).position(|w| w == b"\r\n\r\n").expect("a reply's head") + 4;
    let head = String::from_utf8_lossy(&reply[..head_end]);
    assert!(
        !head.to_ascii_lowercase().contains("transfer-encoding: chunked"),
        "NoETags needs a reply with a Content-Length"
    );
    let mut body = String::from_utf8(reply[head_end..].to_vec()).expect("an XML body");
    while let Some(start) = body.find("<ETag>") {
        let end = body[start..].find("</ETag>").expect("a closed ETag") + start + "</ETag>".len();
        body.replace_range(start..end, "");
    }
    let mut out = String::new();
    for line in head.trim_end().split("\r\n") {
        match line.split_once(':') {
            Some((k, _)) if k.eq_ignore_ascii_case("content-length") => {
                out.push_str(&format!("{k}: {}\r\n", body.len()))
            }
            _ => out.push_str(&format!("{line}\r\n")),
        }
    }
    out.push_str("\r\n");
    out.push_str(&body);
    out.into_bytes()
}
