//! S1/S2: another uid is refused before any frame is parsed; oversized, garbage and truncated frames
//! get a typed error and a closed connection, and the proxy goes on serving everyone else.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use memarts_protocol::{frame, ErrorCode, Hello, Limits, Request, Response, PROTOCOL_VERSION};

use crate::common::files::files_below;
use crate::common::raw::{as_other_user, hello, open_to_other_users, read_response, rss_kib, welcomed};
use crate::common::{moto, pattern, Fleet};

fn assert_closed(s: &mut UnixStream) {
    let mut buf = [0u8; 16];
    match s.read(&mut buf) {
        Ok(0) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("connection still open after a bad frame: {other:?}"),
    }
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
    let fleet = Fleet::start(1, &[]);
    let sock = open_to_other_users(&fleet);
    let bytes = as_other_user(&sock, &hello()).expect("uid 65534 connects once the socket is open to it");
    let mut r: &[u8] = &bytes;
    let (_, resp): (_, Response) = frame::read_sync(&mut r, Limits::RESPONSE).expect("one typed frame");
    match resp {
        Response::Error(e) => assert_eq!(e.code, ErrorCode::PermissionDenied, "{e}"),
        other => panic!("uid 65534 got {other:?}"),
    }
    assert!(r.is_empty(), "nothing but the refusal was sent");
}

#[test]
fn slow_stuck_and_too_many_clients_get_bounded_outcomes_and_others_are_unaffected() {
    let bucket = moto().bucket("hostile");
    let want = pattern(71, 200_000);
    moto().put(&bucket, "o", &want);
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("fleet.toml");
    std::fs::write(&config, "io_timeout_secs = 1.0\nidle_timeout_secs = 3.0\nmax_connections = 256\n")
        .unwrap();
    let fleet = Fleet::start(1, &[("MEMARTS_CONFIG", config.to_str().unwrap())]);
    let sock = fleet.run_dir.join("proxy-0.sock");
    let pid: u32 =
        std::fs::read_to_string(fleet.run_dir.join("proxy-0.pid")).unwrap().trim().parse().unwrap();
    let client = fleet.client(64 << 10);
    let url = format!("s3://{bucket}/o");
    assert_eq!(client.read(&url).unwrap(), want);
    let rss_before = rss_kib(pid);
    let connect = || {
        let s = UnixStream::connect(&sock).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s
    };

    // A byte a second: cut off once one frame has taken longer than the I/O timeout.
    let slow = std::thread::spawn({
        let mut s = connect();
        move || {
            let started = std::time::Instant::now();
            for b in hello() {
                if s.write_all(&[b]).is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(400));
            }
            let mut buf = [0u8; 64];
            let _ = s.read(&mut buf); // the typed error, if any, then EOF
            while matches!(s.read(&mut buf), Ok(n) if n > 0) {}
            started.elapsed()
        }
    });

    // Pipelined requests never read: the proxy's replies fill the socket, its write times out, and it
    // lets go of the connection instead of buffering without bound.
    let mut stuck = connect();
    stuck.write_all(&hello()).unwrap();
    let status = frame::encode(&Request::Status, 0).unwrap();
    stuck.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut sent = 0;
    while sent < 200_000 && stuck.write_all(&status).is_ok() {
        sent += 1;
    }

    // Far more connections than the slot accepts: the extra ones get a typed Unavailable.
    let mut many: Vec<UnixStream> = (0..2_000).map(|_| connect()).collect();
    let mut refused = 0;
    for s in many.iter_mut().skip(300) {
        if let Some(Response::Error(e)) = read_response(s) {
            assert_eq!(e.code, ErrorCode::Unavailable, "{e}");
            refused += 1;
        }
    }
    assert!(
        refused >= 1_500,
        "only {refused} of the connections past the limit were refused with Unavailable"
    );

    // Meanwhile a well-behaved client is served, byte-exact (its pooled connection predates the flood).
    assert_eq!(client.read(&url).unwrap(), want);
    drop(many);
    let slow_took = slow.join().unwrap();
    assert!(
        slow_took < Duration::from_secs(8),
        "a byte-a-second client held its connection for {slow_took:?}"
    );
    drop(stuck);
    assert_eq!(fleet.client(64 << 10).read(&url).unwrap(), want, "a new client after the abuse");
    let rss_after = rss_kib(pid);
    assert!(
        rss_after < rss_before + 64 * 1024,
        "proxy memory grew from {rss_before} KiB to {rss_after} KiB under hostile clients"
    );
}

#[test]
fn a_client_idle_for_longer_than_the_io_timeout_is_still_served() {
    let bucket = moto().bucket("idle");
    let want = pattern(72, 1000);
    moto().put(&bucket, "o", &want);
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("fleet.toml");
    std::fs::write(&config, "io_timeout_secs = 0.3\nidle_timeout_secs = 30.0\n").unwrap();
    let fleet = Fleet::start(1, &[("MEMARTS_CONFIG", config.to_str().unwrap())]);
    let client = fleet.client(64 << 10);
    let url = format!("s3://{bucket}/o");
    assert_eq!(client.read(&url).unwrap(), want);
    // Idle on its pooled connection for longer than the time one frame may take, not than the idle
    // timeout: the next request is served, not refused as a frame that "did not arrive in time".
    std::thread::sleep(Duration::from_millis(800));
    assert_eq!(client.read(&url).unwrap(), want);
}

#[test]
fn hostile_keys_get_typed_errors_and_touch_nothing_outside_the_cache() {
    let bucket = moto().bucket("keys");
    let want = pattern(73, 5000);
    moto().put(&bucket, "ok", &want);
    let fleet = Fleet::start(1, &[]);
    let outside = fleet.dir.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let before = files_below(fleet.dir.path());
    let sock = fleet.run_dir.join("proxy-0.sock");
    let ask = |request: &[u8]| {
        let mut s = welcomed(&sock);
        // A frame over the size limit is refused from its head: the rest of it may meet a closed socket.
        let _ = s.write_all(request);
        read_response(&mut s)
    };
    let hostile = [
        format!("s3://{bucket}/../../outside/escaped"),
        format!("s3://{bucket}/a/../../../outside/escaped"),
        format!("s3://{bucket}/a\0b"),
        format!("s3://{bucket}/{}", "k".repeat(1 << 20)),
        format!("file://{}/../outside/escaped", fleet.cache_dir.display()),
        "s3:///no-bucket".to_string(),
        "gopher://host/x".to_string(),
    ];
    for url in &hostile {
        for request in [
            Request::Stat { url: url.clone(), refresh: false },
            Request::PutMemartsStart { url: url.clone() },
            Request::Delete { url: url.clone() },
        ] {
            let what = format!("{request:?}").chars().take(80).collect::<String>();
            match ask(&frame::encode(&request, 0).unwrap()) {
                Some(Response::Error(e)) => assert!(
                    matches!(e.code, ErrorCode::BadRequest | ErrorCode::NotFound),
                    "{what}: {:?} {e}",
                    e.code
                ),
                // Deleting or starting a memarts-only write of an odd but valid key is allowed; it
                // must still land inside the cache (checked below).
                Some(Response::Deleted) | Some(Response::PutAck { .. }) => {}
                None => {} // refused with the connection closed (a frame over the size limit)
                other => panic!("{what}: {other:?}"),
            }
        }
    }
    // A string that is not UTF-8 where the message has one.
    let mut bytes = frame::encode(&Request::Stat { url: "s3://b/AAAA".into(), refresh: false }, 0).unwrap();
    let at = bytes.windows(4).position(|w| w == b"AAAA").unwrap();
    bytes[at..at + 4].copy_from_slice(&[0xff, 0xfe, 0xc0, 0x80]);
    match ask(&bytes) {
        Some(Response::Error(e)) => assert_eq!(e.code, ErrorCode::BadRequest, "{e}"),
        other => panic!("invalid UTF-8: {other:?}"),
    }
    // Nothing appeared outside the cache dir and the run dir, and the slot still serves.
    let created: Vec<_> = files_below(fleet.dir.path())
        .into_iter()
        .filter(|p| !before.contains(p) && !p.starts_with(&fleet.cache_dir) && !p.starts_with(&fleet.run_dir))
        .collect();
    assert!(created.is_empty(), "hostile keys created {created:?}");
    assert!(files_below(&outside).is_empty());
    assert_eq!(fleet.client(64 << 10).read(&format!("s3://{bucket}/ok")).unwrap(), want);
}
