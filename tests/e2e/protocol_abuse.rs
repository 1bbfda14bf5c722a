//! S1/S2: another uid is refused before any frame is parsed; oversized, garbage and truncated frames
//! get a typed error and a closed connection, and the proxy goes on serving everyone else.

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::time::Duration;

use memarts_protocol::{frame, ErrorCode, Hello, Limits, Request, Response, PROTOCOL_VERSION};

use crate::common::{moto, pattern, Fleet};

/// Reads one response frame, or `None` if the proxy closed the connection first.
fn read_response(s: &mut UnixStream) -> Option<Response> {
    frame::read_sync::<Response, _>(s, Limits::RESPONSE).ok().map(|(_, r)| r)
}

fn assert_closed(s: &mut UnixStream) {
    let mut buf = [0u8; 16];
    match s.read(&mut buf) {
        Ok(0) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("connection still open after a bad frame: {other:?}"),
    }
}

fn hello() -> Vec<u8> {
    frame::encode(&Request::Hello(Hello { protocol_version: PROTOCOL_VERSION, client: "raw".into() }), 0)
        .unwrap()
}

fn expect_bad_request(s: &mut UnixStream, what: &str) {
    match read_response(s) {
        Some(Response::Error(e)) => assert_eq!(e.code, ErrorCode::BadRequest, "{what}: {e}"),
        other => panic!("{what}: expected a typed BadRequest, got {other:?}"),
    }
    assert_closed(s);
}

#[test]
fn bad_frames_get_a_typed_error_and_a_closed_connection_and_others_are_unaffected() {
    let bucket = moto().bucket("abuse");
    let want = pattern(70, 300_000);
    moto().put(&bucket, "o", &want);
    let fleet = Fleet::start(1, &[]);
    let sock = fleet.run_dir.join("proxy-0.sock");
    let client = fleet.client(64 << 10);
    let url = format!("s3://{bucket}/o");
    // A well-behaved client holds a connection open across all the abuse.
    assert_eq!(client.read(&url).unwrap(), want);

    let connect = || {
        let s = UnixStream::connect(&sock).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s
    };

    // A huge length prefix: refused before anything is allocated.
    let mut s = connect();
    s.write_all(&[0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0]).unwrap();
    expect_bad_request(&mut s, "huge length");

    // Garbage where Hello should be.
    let mut s = connect();
    s.write_all(&[5, 0, 0, 0, 0, 0, 0, 0, 0xde, 0xad, 0xbe, 0xef, 0x99]).unwrap();
    expect_bad_request(&mut s, "garbage");

    // A valid Hello, then garbage with trailing bytes.
    let mut s = connect();
    s.write_all(&hello()).unwrap();
    assert!(matches!(read_response(&mut s), Some(Response::Welcome(_))));
    s.write_all(&[3, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0]).unwrap();
    expect_bad_request(&mut s, "trailing garbage");

    // An unknown protocol version: a typed Incompatible.
    let mut s = connect();
    let future =
        frame::encode(&Request::Hello(Hello { protocol_version: 999, client: "x".into() }), 0).unwrap();
    s.write_all(&future).unwrap();
    assert!(matches!(
        read_response(&mut s),
        Some(Response::Incompatible { supported: PROTOCOL_VERSION, .. })
    ));
    assert_closed(&mut s);

    // A request before Hello.
    let mut s = connect();
    s.write_all(&frame::encode(&Request::Status, 0).unwrap()).unwrap();
    expect_bad_request(&mut s, "no hello");

    // A truncated frame: the head promises more than ever arrives.
    let mut s = connect();
    s.write_all(&[100, 0, 0, 0, 0, 0, 0, 0, 1, 2]).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    assert!(read_response(&mut s).is_none(), "a truncated frame got an answer");

    // Everyone else is still served.
    assert_eq!(client.read(&url).unwrap(), want);
    assert!(fleet.status()["slots"][0]["alive"].as_bool().unwrap());
}

#[test]
fn a_client_of_another_uid_is_refused_before_any_frame_is_parsed() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test switches to uid 65534 to act as another user and must run as root (CI does)"
    );
    let fleet = Fleet::start(1, &[]);
    let sock = fleet.run_dir.join("proxy-0.sock");
    // The run dir (0700) and socket (0600) already keep other users out; open them up so that the
    // SO_PEERCRED check is the line being tested.
    std::fs::set_permissions(&fleet.run_dir, std::fs::Permissions::from_mode(0o711)).unwrap();
    std::fs::set_permissions(fleet.dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o666)).unwrap();
    let script = "import socket,sys\n\
        s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.sendall(bytes.fromhex(sys.argv[2]))\n\
        data=b''\n\
        while True:\n    d=s.recv(65536)\n    if not d: break\n    data+=d\n\
        print(data.hex())\n";
    let mut cmd = std::process::Command::new("python3");
    cmd.args(["-c", script, &sock.display().to_string(), &hex(&hello())]);
    // SAFETY: setgid/setuid in the child before exec; they only change the child's credentials.
    unsafe {
        cmd.pre_exec(|| {
            nix::unistd::setgroups(&[]).map_err(std::io::Error::from)?;
            nix::unistd::setgid(nix::unistd::Gid::from_raw(65534)).map_err(std::io::Error::from)?;
            nix::unistd::setuid(nix::unistd::Uid::from_raw(65534)).map_err(std::io::Error::from)?;
            Ok(())
        });
    }
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "client as uid 65534 failed: {}", String::from_utf8_lossy(&out.stderr));
    let bytes = unhex(String::from_utf8_lossy(&out.stdout).trim());
    let mut r: &[u8] = &bytes;
    let (_, resp): (_, Response) = frame::read_sync(&mut r, Limits::RESPONSE).expect("one typed frame");
    match resp {
        Response::Error(e) => assert_eq!(e.code, ErrorCode::PermissionDenied, "{e}"),
        other => panic!("uid 65534 got {other:?}"),
    }
    assert!(r.is_empty(), "nothing but the refusal was sent");
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}
