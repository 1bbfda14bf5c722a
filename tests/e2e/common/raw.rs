//! Hostile clients speak the wire protocol by hand: the handshake frame, reading one response, a
//! client run as another user (`setpriv`), and what a test checks of the proxy afterwards (its
//! memory, the files it created).

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use memarts_protocol::{frame, Hello, Limits, Request, Response, PROTOCOL_VERSION};

use super::Fleet;

/// A valid opening frame.
pub fn hello() -> Vec<u8> {
    frame::encode(&Request::Hello(Hello { protocol_version: PROTOCOL_VERSION, client: "raw".into() }), 0)
        .unwrap()
}

/// A connection to the slot at `sock` past its handshake (reads time out after 10 s).
pub fn welcomed(sock: &Path) -> UnixStream {
    use std::io::Write;
    let mut s = UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
    s.write_all(&hello()).unwrap();
    assert!(
        matches!(read_response(&mut s), Some(Response::Welcome(_))),
        "no Welcome from {}",
        sock.display()
    );
    s
}

/// Sends `req` on `s` and reads its answer (`None`: the proxy closed the connection).
pub fn call(s: &mut UnixStream, req: &Request) -> Option<Response> {
    use std::io::Write;
    s.write_all(&frame::encode(req, 0).unwrap()).unwrap();
    read_response(s)
}

/// Reads one response frame, or `None` if the proxy closed the connection first.
pub fn read_response(s: &mut UnixStream) -> Option<Response> {
    frame::read_sync::<Response, _>(s, Limits::RESPONSE).ok().map(|(_, r)| r)
}

/// Resident memory of a process, KiB (`field` = `VmRSS` now, `VmHWM` at its peak).
pub fn proc_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with(field)).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Resident memory of a process now, KiB.
pub fn rss_kib(pid: u32) -> u64 {
    proc_kib(pid, "VmRSS:")
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub fn unhex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

/// The uid (and gid) the other-user clients run as.
pub const OTHER_UID: u32 = 65534;

/// Opens up slot 0 of `fleet` to other users: its run dir (0700) and socket (0600) keep them out
/// already, so this makes the `SO_PEERCRED` check the line being tested.
pub fn open_to_other_users(fleet: &Fleet) -> PathBuf {
    let sock = fleet.run_dir.join("proxy-0.sock");
    std::fs::set_permissions(&fleet.run_dir, std::fs::Permissions::from_mode(0o711)).unwrap();
    std::fs::set_permissions(fleet.dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o666)).unwrap();
    sock
}

/// What a client of another user got: the bytes the proxy sent until it closed, or the error
/// (`errno`) that kept it from connecting.
pub type OtherUserReply = Result<Vec<u8>, i32>;

/// Runs a client under `setpriv --reuid=65534 --regid=65534 --clear-groups` that connects to
/// `sock`, sends `bytes`, shuts its write side and reads until the proxy closes. It runs on the
/// system python: the user's (pyenv under /root) is out of the other user's reach.
pub fn as_other_user(sock: &Path, bytes: &[u8]) -> OtherUserReply {
    assert!(
        nix::unistd::geteuid().is_root(),
        "acting as another user (setpriv to uid {OTHER_UID}) needs root; CI runs the tests as root"
    );
    let python = ["/usr/bin/python3", "/usr/local/bin/python3"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("a system python3 (/usr/bin/python3) the other user can run");
    let script = "import socket,sys\n\
        s=socket.socket(socket.AF_UNIX)\n\
        try:\n    s.connect(sys.argv[1])\n\
        except OSError as e:\n    print('connect-error', e.errno); sys.exit(0)\n\
        try:\n    s.sendall(bytes.fromhex(sys.argv[2])); s.shutdown(socket.SHUT_WR)\n\
        except OSError:\n    pass\n\
        data=b''\n\
        while True:\n    \
            try:\n        d=s.recv(65536)\n    \
            except ConnectionResetError:\n        break\n    \
            if not d: break\n    data+=d\n\
        print('got', data.hex())\n";
    let id = OTHER_UID.to_string();
    let out: Output = Command::new("setpriv")
        .args([&format!("--reuid={id}"), &format!("--regid={id}"), "--clear-groups", python, "-c", script])
        .arg(sock)
        .arg(hex(bytes))
        .output()
        .expect("run setpriv (util-linux)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "client as uid {OTHER_UID} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    match stdout.trim().split_once(' ') {
        Some(("got", h)) => Ok(unhex(h.trim())),
        Some(("connect-error", e)) => Err(e.trim().parse().unwrap_or(-1)),
        _ if stdout.trim() == "got" => Ok(Vec::new()),
        _ => panic!("client as uid {OTHER_UID} printed {stdout:?}"),
    }
}
