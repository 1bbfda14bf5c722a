//! S4: credentials never reach a shim, a log or the status output, even from an origin that echoes
//! them. Real S3 does: `ExpiredToken` and `InvalidToken` errors carry the session token
//! (`<Token-0>`), and `SignatureDoesNotMatch` carries the canonical request, which holds the
//! `x-amz-security-token` header. A fake S3 endpoint here answers exactly so, and every byte the
//! proxy sends back on the wire, every shim error, both logs and `memarts status` are searched for
//! the secret and the token.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use memarts_protocol::{frame, ChunkRequest, FirstRequest, Limits, ListRequest, Request, Response};

use crate::common::raw::hello;
use crate::common::Fleet;

const KEY_ID: &str = "E2EKEYID";
const SECRET: &str = "e2e-wire-SECRET-6c1f0e93";
const TOKEN: &str = "e2e-wire-TOKEN-d27a4b18";

/// A fake S3 endpoint that refuses everything, echoing what S3 echoes: `/b/expired*` and
/// `/b/invalid*` get a 400 with the token, `/b/signature*` a 403 with the canonical request, anything
/// else a 404. Returns its endpoint.
fn echoing_origin() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            std::thread::spawn(move || answer(conn));
        }
    });
    endpoint
}

fn answer(mut conn: TcpStream) {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match conn.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => return,
        }
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let (method, path) = {
        let mut first = head.split(' ');
        (first.next().unwrap_or("").to_string(), first.next().unwrap_or("").to_string())
    };
    let header = |name: &str| {
        head.lines()
            .filter_map(|l| l.split_once(':'))
            .find(|(k, _)| k.trim().eq_ignore_ascii_case(name))
            .map_or(String::new(), |(_, v)| v.trim().to_string())
    };
    let token = header("x-amz-security-token");
    let (status, body) = if path.contains("/expired") || path.contains("/invalid") {
        let code = if path.contains("/expired") { "ExpiredToken" } else { "InvalidToken" };
        (
            "400 Bad Request",
            format!(
                "<Error><Code>{code}</Code><Message>The provided token is not valid.</Message>\
                 <Token-0>{token}</Token-0><RequestId>R1</RequestId></Error>"
            ),
        )
    } else if path.contains("/signature") {
        let canonical: String = head
            .lines()
            .skip(1)
            .filter(|l| !l.is_empty())
            .map(|l| format!("{}\n", l.to_lowercase()))
            .collect();
        (
            "403 Forbidden",
            format!(
                "<Error><Code>SignatureDoesNotMatch</Code><Message>The request signature we calculated \
                 does not match the signature you provided.</Message><AWSAccessKeyId>{KEY_ID}</AWSAccessKeyId>\
                 <CanonicalRequest>{method}\n{path}\n\n{canonical}</CanonicalRequest>\
                 <RequestId>R2</RequestId></Error>"
            ),
        )
    } else {
        ("404 Not Found", "<Error><Code>NoSuchKey</Code><Message>none</Message></Error>".to_string())
    };
    let body = if method == "HEAD" { String::new() } else { body };
    let reply = format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/xml\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = conn.write_all(reply.as_bytes());
}

fn assert_clean(what: &str, seen: &[u8]) {
    let seen = String::from_utf8_lossy(seen);
    assert!(!seen.contains(SECRET), "the secret reached {what}:\n{seen}");
    assert!(!seen.contains(TOKEN), "the session token reached {what}:\n{seen}");
}

/// Sends the frame `bytes` on `s` and returns every byte of the answer (frame and payload).
fn raw_call(s: &mut UnixStream, bytes: &[u8]) -> Vec<u8> {
    struct Tee<'a>(&'a mut UnixStream, Vec<u8>);
    impl Read for Tee<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = self.0.read(buf)?;
            self.1.extend_from_slice(&buf[..n]);
            Ok(n)
        }
    }
    s.write_all(bytes).unwrap();
    let mut tee = Tee(s, Vec::new());
    let (head, _): (_, Response) = frame::read_sync(&mut tee, Limits::RESPONSE).expect("a response");
    let mut payload = vec![0u8; head.payload_len as usize];
    tee.read_exact(&mut payload).unwrap();
    tee.1
}

#[test]
fn credentials_never_reach_the_wire_the_logs_or_the_status_even_when_the_origin_echoes_them() {
    let endpoint = echoing_origin();
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("origin.toml");
    std::fs::write(&cfg, "[origin]\nmax_attempts = 2\nbackoff_base_ms = 1\nbackoff_max_ms = 5\n").unwrap();
    let fleet = Fleet::start(
        1,
        &[
            ("AWS_ENDPOINT_URL", &endpoint),
            ("AWS_ACCESS_KEY_ID", KEY_ID),
            ("AWS_SECRET_ACCESS_KEY", SECRET),
            ("AWS_SESSION_TOKEN", TOKEN),
            ("MEMARTS_CONFIG", cfg.to_str().unwrap()),
        ],
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while fleet.status()["slots"][0]["index_ready"] != true {
        assert!(Instant::now() < deadline, "the index was never ready");
        std::thread::sleep(Duration::from_millis(20));
    }
    let keys = ["expired", "invalid", "signature", "missing"];

    // Through the shim: every call fails, and no error message holds a credential.
    let client = fleet.client(64 << 10);
    let mut errors = String::new();
    for key in keys {
        let url = format!("s3://b/{key}");
        for got in [client.read(&url).map(drop), client.stat_opts(&url, true).map(drop)] {
            let e = got.expect_err("the fake origin refuses everything");
            errors.push_str(&format!("{key}: {e}\n"));
        }
    }
    assert_clean("a shim error", errors.as_bytes());

    // Raw: every byte the proxy sends back, for every kind of request that reaches the origin.
    let mut s = UnixStream::connect(fleet.run_dir.join("proxy-0.sock")).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut wire = raw_call(&mut s, &hello());
    for key in keys {
        let url = format!("s3://b/{key}-raw");
        let chunk = ChunkRequest {
            url: url.clone(),
            etag: "\"0123abcd\"".into(),
            object_size: 100_000,
            chunk_size: 64 << 10,
            index: 1,
            recheck: false,
        };
        for req in [
            Request::Stat { url: url.clone(), refresh: true },
            Request::ReadFirst(FirstRequest { url: url.clone(), chunk_size: 64 << 10, refresh: false }),
            Request::ReadChunk(chunk.clone()),
            Request::ReadChunks(vec![chunk.clone(), ChunkRequest { index: 0, ..chunk }]),
            Request::List(ListRequest {
                url: url.clone(),
                recursive: true,
                start_after: None,
                max_entries: 10,
            }),
            Request::Delete { url: url.clone() },
            Request::Status,
        ] {
            wire.extend(raw_call(&mut s, &frame::encode(&req, 0).unwrap()));
        }
    }
    assert!(!wire.is_empty());
    assert_clean("the wire", &wire);

    // The logs and the status output.
    let status = fleet.memarts(&["status", "--json"]);
    assert_clean("memarts status", &[status.stdout, status.stderr].concat());
    for log in ["proxy-0.log", "origin-0.log"] {
        let text = std::fs::read(fleet.run_dir.join(log)).unwrap_or_default();
        assert!(!text.is_empty(), "{log} is empty: the origin was never asked");
        assert_clean(log, &text);
    }
}
