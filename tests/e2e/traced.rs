//! Promises about the order of system calls, read from `strace` of the real processes: D1
//! (`write_memarts` is acknowledged only after the data is fsynced, renamed into place and the
//! directory fsynced) and S1 (the run dir is 0700 and the sockets 0600 from the moment they exist;
//! and, without strace, a uid listed in `allowed_uids` gets past the peer-credential check).
//!
//! The fleet is started by `memarts start_proxy` under `strace` (that process only), and each proxy
//! through `MEMARTS_PROXY_BIN`, a wrapper that runs it under `strace -f`. strace must be installed;
//! without it these tests fail, they never pass vacuously.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::moto::target_dir;
use crate::common::{pattern, text, Fleet};

/// System calls of the proxies kept in their traces.
const PROXY_CALLS: &str =
    "openat,pwrite64,fsync,fdatasync,rename,renameat,renameat2,write,writev,sendmsg,sendto,umask,bind";

/// A fleet of `n` slots whose `start_proxy` and proxies ran under strace; the traces are in
/// `fleet.dir`: `cli.trace` and `slot-<n>.trace`.
fn traced_fleet(n: u32) -> Fleet {
    let probe = Command::new("strace").arg("-V").output();
    assert!(probe.is_ok_and(|o| o.status.success()), "these tests need strace (apt-get install strace)");
    let fleet = Fleet::new(&[]);
    let dir = fleet.dir.path();
    let wrapper = dir.join("traced-proxy.sh");
    let proxy = target_dir().join("memarts-proxy");
    assert!(proxy.exists(), "{} is missing: build the binaries first", proxy.display());
    // `memarts start_proxy` runs `<proxy> --fleet <file> --slot <n>`: $4 is the slot.
    let script = format!(
        "#!/bin/sh\nexec strace -f -q -yy -s 4096 -e trace={PROXY_CALLS} -o '{}/slot-'\"$4\".trace '{}' \"$@\"\n",
        dir.display(),
        proxy.display()
    );
    std::fs::write(&wrapper, script).unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o700)).unwrap();
    let cli = fleet.command(&["start_proxy", &n.to_string()]);
    let mut traced = Command::new("strace");
    traced
        .args(["-qq", "-s", "4096", "-e", "trace=mkdir,mkdirat,chmod,fchmodat,umask", "-o"])
        .arg(dir.join("cli.trace"))
        .arg(cli.get_program())
        .args(cli.get_args())
        .envs(cli.get_envs().filter_map(|(k, v)| Some((k, v?))))
        .env("MEMARTS_PROXY_BIN", &wrapper);
    let out = traced.output().expect("run start_proxy under strace");
    assert!(
        out.status.success(),
        "start_proxy under strace failed:\n{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    fleet
}

/// One system call in a trace: where it started and ended (line numbers of the trace, which strace
/// writes in the order it sees the calls of all threads), its name and its arguments.
#[derive(Debug, Clone)]
struct Call {
    start: usize,
    end: usize,
    name: String,
    args: String,
}

/// Parses strace output, joining `<unfinished ...>` and `<... resumed>` halves by thread.
fn parse(trace: &str) -> Vec<Call> {
    let mut calls = Vec::new();
    let mut pending: std::collections::HashMap<&str, Call> = std::collections::HashMap::new();
    for (i, line) in trace.lines().enumerate() {
        // `strace -f` starts each line with the thread id; a trace of one thread does not.
        let (tid, rest) = match line.split_once(' ') {
            Some((tid, rest)) if tid.bytes().all(|b| b.is_ascii_digit()) => (tid, rest.trim_start()),
            _ => ("", line),
        };
        if let Some(resumed) = rest.strip_prefix("<... ") {
            let name = resumed.split(' ').next().unwrap_or_default();
            if let Some(mut call) = pending.remove(tid) {
                assert_eq!(call.name, name, "trace line {i}: {line}");
                call.end = i;
                calls.push(call);
            }
            continue;
        }
        let Some((name, args)) = rest.split_once('(') else { continue };
        let call = Call { start: i, end: i, name: name.to_string(), args: args.to_string() };
        if rest.ends_with("<unfinished ...>") {
            pending.insert(tid, call);
        } else {
            calls.push(call);
        }
    }
    calls.sort_by_key(|c| c.start);
    calls
}

/// Stops the fleet and waits until the tracers of its slots have exited, so the traces are complete.
fn stop_traced(fleet: &Fleet, n: u32) {
    let tracers: Vec<i32> = (0..n)
        .map(|slot| {
            let status = std::fs::read_to_string(format!("/proc/{}/status", fleet.pid(slot))).unwrap();
            let tracer = status.lines().find_map(|l| l.strip_prefix("TracerPid:")).unwrap().trim();
            tracer.parse().unwrap()
        })
        .collect();
    assert!(tracers.iter().all(|&t| t > 0), "a slot runs without its tracer: {tracers:?}");
    fleet.stop_proxy();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while tracers.iter().any(|&t| Path::new(&format!("/proc/{t}")).exists()) {
        assert!(std::time::Instant::now() < deadline, "the tracers did not exit");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

fn read_trace(path: &Path) -> Vec<Call> {
    let trace = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    parse(&trace)
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())).mode() & 0o777
}

/// The first quoted string of a call's arguments.
fn first_string(args: &str) -> &str {
    args.split('"').nth(1).unwrap_or_default()
}

#[test]
fn write_memarts_is_acknowledged_only_after_fsync_rename_and_directory_fsync() {
    let fleet = traced_fleet(1);
    let client = fleet.client(1 << 20);
    // Small, large, empty, and an overwrite of an existing object.
    let objects: Vec<(String, Vec<u8>)> = [(0, 1000), (1, 3 << 20), (2, 0), (0, 5000)]
        .into_iter()
        .map(|(k, len)| (format!("s3://durable/obj-{k}"), pattern(4000 + len as u64, len)))
        .collect();
    for (url, data) in &objects {
        client.put_memarts_bytes(url, data).unwrap_or_else(|e| panic!("{url}: {e}"));
    }
    stop_traced(&fleet, 1);
    let calls = read_trace(&fleet.dir.path().join("slot-0.trace"));
    let memarts_dir = fleet.cache_dir.join("v1/memarts").display().to_string();
    let renames: Vec<&Call> = calls
        .iter()
        .filter(|c| c.name.starts_with("rename") && c.args.contains(&format!("{memarts_dir}/")))
        .collect();
    assert_eq!(renames.len(), objects.len(), "one rename into v1/memarts per object: {renames:#?}");
    let replies: Vec<&Call> = calls
        .iter()
        .filter(|c| matches!(c.name.as_str(), "write" | "writev" | "sendmsg" | "sendto"))
        .filter(|c| c.args.contains("UNIX-STREAM") && c.args.contains("memarts-only"))
        .collect();
    assert_eq!(replies.len(), objects.len(), "one acknowledgement per object: {replies:#?}");
    for (i, (rename, reply)) in renames.iter().zip(&replies).enumerate() {
        let tmp = first_string(&rename.args);
        assert!(tmp.contains("/v1/tmp/"), "object {i} was not written to a temp file first: {rename:?}");
        let on_tmp = |c: &&Call| {
            c.args.starts_with(|ch: char| ch.is_ascii_digit()) && c.args.contains(&format!("<{tmp}>"))
        };
        let writes: Vec<&Call> = calls.iter().filter(|c| c.name == "pwrite64").filter(on_tmp).collect();
        let sync = calls
            .iter()
            .filter(|c| c.name == "fsync" || c.name == "fdatasync")
            .find(on_tmp)
            .unwrap_or_else(|| panic!("object {i}: its temp file {tmp} was never fsynced"));
        assert!(!writes.is_empty(), "object {i}: nothing was written to {tmp} (at least the header is)");
        for w in &writes {
            assert!(
                w.end < sync.start,
                "object {i}: a write to the temp file after its fsync: {w:?} {sync:?}"
            );
        }
        assert!(
            sync.end < rename.start,
            "object {i}: renamed before its fsync returned: {sync:?} {rename:?}"
        );
        let dir_sync = calls
            .iter()
            .filter(|c| c.name == "fsync" || c.name == "fdatasync")
            .find(|c| c.start > rename.end && c.args.contains(&format!("<{memarts_dir}>")))
            .unwrap_or_else(|| panic!("object {i}: v1/memarts was not fsynced after the rename"));
        assert!(
            dir_sync.end < reply.start,
            "object {i}: acknowledged before the directory fsync returned: {dir_sync:?} {reply:?}"
        );
        assert!(rename.end < reply.start, "object {i}: acknowledged before the rename: {reply:?}");
    }
    // And the objects are there, byte for byte, when the slot comes back.
    fleet.start_proxy(1);
    let client = fleet.client(1 << 20);
    for (url, data) in objects.iter().skip(1) {
        let mut sink = memarts_shim::VecSink::default();
        client.read_memarts_to(url, &mut sink).unwrap();
        // SAFETY: read_memarts_to returned Ok, so every reserved byte was written.
        assert!(unsafe { sink.finish() } == *data, "{url} differs");
    }
}

#[test]
fn run_dir_is_0700_and_sockets_0600_from_creation_and_files_stay_private() {
    let fleet = traced_fleet(2);
    let run_dir = fleet.run_dir.display().to_string();
    let socks: Vec<PathBuf> = (0..2).map(|slot| fleet.run_dir.join(format!("proxy-{slot}.sock"))).collect();
    for sock in &socks {
        assert_eq!(mode(sock), 0o600, "{}", sock.display());
    }
    // Everything start_proxy and the proxies created is private.
    let client = fleet.client(64 << 10);
    let data = pattern(4100, 200_000);
    let path = fleet.dir.path().join("origin.bin");
    std::fs::write(&path, &data).unwrap();
    assert!(client.read(&path.display().to_string()).unwrap() == data);
    client.put_memarts_bytes("s3://private/o", b"memarts-only bytes").unwrap();
    fleet.wait_cached(4);
    assert_eq!(mode(&fleet.run_dir), 0o700, "run dir");
    for entry in std::fs::read_dir(&fleet.run_dir).unwrap().flatten() {
        let m = mode(&entry.path());
        assert!(m & 0o077 == 0, "{} is {m:o}: open to others", entry.path().display());
    }
    let mut stack: Vec<PathBuf> = vec![fleet.cache_dir.clone()];
    let mut files = 0;
    while let Some(d) = stack.pop() {
        assert_eq!(mode(&d), 0o700, "cache directory {}", d.display());
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else {
                files += 1;
                assert_eq!(mode(&e.path()), 0o600, "cache file {}", e.path().display());
            }
        }
    }
    assert!(files >= 5, "only {files} files in the cache: chunks and the memarts-only object expected");
    stop_traced(&fleet, 2);
    // The run dir is created 0700 by start_proxy: there is no moment when it is open to others.
    let cli = read_trace(&fleet.dir.path().join("cli.trace"));
    let made = cli
        .iter()
        .find(|c| c.name.starts_with("mkdir") && c.args.contains(&format!("\"{run_dir}\"")))
        .unwrap_or_else(|| panic!("start_proxy did not create the run dir: {cli:#?}"));
    assert!(made.args.contains(", 0700)"), "run dir created with {made:?}");
    // Each socket is bound under umask 0177, so it is 0600 the moment it exists, and the umask is put
    // back right after.
    for slot in 0..2 {
        let calls = read_trace(&fleet.dir.path().join(format!("slot-{slot}.trace")));
        let sock = format!("{run_dir}/proxy-{slot}.sock");
        let bind = calls
            .iter()
            .find(|c| c.name == "bind" && c.args.contains(&format!("sun_path=\"{sock}\"")))
            .unwrap_or_else(|| panic!("slot {slot} never bound {sock}"));
        let umasks: Vec<&Call> = calls.iter().filter(|c| c.name == "umask").collect();
        let before = umasks.iter().rev().find(|c| c.end < bind.start).expect("a umask before bind");
        assert!(before.args.starts_with("0177)"), "slot {slot}: bound under {before:?}, not umask 0177");
        let after = umasks.iter().find(|c| c.start > bind.end).expect("the umask restored after bind");
        assert!(!after.args.starts_with("0177)"), "slot {slot}: umask left at 0177: {after:?}");
    }
}

#[test]
fn a_uid_in_allowed_uids_gets_past_the_peer_credential_check() {
    use crate::common::raw::{as_other_user, hello, open_to_other_users, OTHER_UID};
    use memarts_protocol::{frame, Limits, Request, Response};
    // The refusal of a uid that is not allowed: protocol_abuse.rs. Here the same client, allowed.
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("fleet.toml");
    std::fs::write(&config, format!("allowed_uids = [{OTHER_UID}]\n")).unwrap();
    let fleet = Fleet::start(1, &[("MEMARTS_CONFIG", config.to_str().unwrap())]);
    let sock = open_to_other_users(&fleet);
    let request = [hello(), frame::encode(&Request::Status, 0).unwrap()].concat();
    let bytes = as_other_user(&sock, &request).expect("uid 65534 connects once the socket is open to it");
    let mut r: &[u8] = &bytes;
    let (_, welcome): (_, Response) = frame::read_sync(&mut r, Limits::RESPONSE).expect("a first frame");
    assert!(matches!(welcome, Response::Welcome(_)), "allowed uid {OTHER_UID} got {welcome:?}");
    let (_, status): (_, Response) = frame::read_sync(&mut r, Limits::RESPONSE).expect("a second frame");
    assert!(matches!(status, Response::Status(_)), "allowed uid {OTHER_UID} got {status:?}");
}
