//! Uploads through a slot: nothing becomes visible at the origin unless every byte arrived and its
//! CRC32C matches, whatever the client does.

use std::io::Write;
use std::os::unix::net::UnixStream;

use memarts_protocol::{crc32c, frame, ErrorCode, Hello, Limits, Request, Response, PROTOCOL_VERSION};

use crate::common::{moto, pattern, Fleet};

fn connect(fleet: &Fleet) -> UnixStream {
    let mut s = UnixStream::connect(fleet.run_dir.join("proxy-0.sock")).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(30))).unwrap();
    let hello = Request::Hello(Hello { protocol_version: PROTOCOL_VERSION, client: "upload-test".into() });
    assert!(matches!(call(&mut s, &hello, &[]), Response::Welcome(_)));
    s
}

fn call(s: &mut UnixStream, req: &Request, payload: &[u8]) -> Response {
    s.write_all(&frame::encode(req, payload.len()).unwrap()).unwrap();
    s.write_all(payload).unwrap();
    frame::read_sync::<Response, _>(s, Limits::RESPONSE).unwrap().1
}

#[test]
fn an_upload_is_visible_only_when_complete_and_checked() {
    let bucket = moto().bucket("upload");
    let fleet = Fleet::start(1, &[]);
    let client = fleet.client(64 << 10);
    let data = pattern(700, 3 << 20);
    let url = format!("s3://{bucket}/u.bin");

    // PutData before PutStart is refused, typed.
    let mut s = connect(&fleet);
    assert!(
        matches!(call(&mut s, &Request::PutData, b"x"), Response::Error(e) if e.code == ErrorCode::BadRequest)
    );

    // A wrong checksum: refused, nothing written.
    assert!(matches!(
        call(&mut s, &Request::PutStart { url: url.clone() }, &[]),
        Response::PutAck { received: 0 }
    ));
    assert!(
        matches!(call(&mut s, &Request::PutData, &data), Response::PutAck { received } if received == data.len() as u64)
    );
    let finish = Request::PutFinish { size: data.len() as u64, crc32c: crc32c(&data) ^ 1 };
    assert!(matches!(call(&mut s, &finish, &[]), Response::Error(e) if e.code == ErrorCode::BadRequest));
    assert!(matches!(client.stat(&url), Err(memarts_shim::Error::NotFound(_))));

    // A client that disappears mid-upload: nothing written.
    assert!(matches!(call(&mut s, &Request::PutStart { url: url.clone() }, &[]), Response::PutAck { .. }));
    assert!(matches!(call(&mut s, &Request::PutData, &data[..1000]), Response::PutAck { .. }));
    drop(s);
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(matches!(client.stat(&url), Err(memarts_shim::Error::NotFound(_))));

    // The shim's upload: visible, byte-exact, and read back at once.
    let meta = client.put_bytes(&url, &data).unwrap();
    assert_eq!(meta.size, data.len() as u64);
    assert_eq!(client.read(&url).unwrap(), data);
}
