//! S3 credentials from a credentials file (promises O2, S4): a fleet started with one reads from the
//! real S3 server with it and keeps serving while the file is being rewritten; a missing or invalid
//! file fails `start_proxy` with an error naming it; the secret and the token reach no log, no status
//! output and not `fleet.json`. (moto accepts any key: rotation against a server that checks keys is
//! tested elsewhere.)

use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::{moto, pattern, text, Fleet};

const SECRET: &str = "e2e-SECRET-5f1c0a77d2";
const TOKEN: &str = "e2e-TOKEN-9b2d41e3a8";

fn credentials(key_id: &str, expiration: &str) -> String {
    format!(
        r#"{{"AccessKeyId": "{key_id}", "AccessKeySecret": "{SECRET}", "SecurityToken": "{TOKEN}",
            "Expiration": "{expiration}"}}"#
    )
}

fn assert_no_secret(what: &str, text: &str) {
    assert!(!text.contains(SECRET), "the secret leaked into {what}:\n{text}");
    assert!(!text.contains(TOKEN), "the token leaked into {what}:\n{text}");
}

/// The slot's log once it contains `needle` (the proxy writes it as it goes).
fn log_with(fleet: &Fleet, needle: &str) -> String {
    let path = fleet.run_dir.join("proxy-0.log");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let log = std::fs::read_to_string(&path).unwrap_or_default();
        if log.contains(needle) {
            return log;
        }
        assert!(Instant::now() < deadline, "{needle:?} never appeared in {}:\n{log}", path.display());
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_fleet_reads_with_the_credentials_file_and_keeps_its_credential_while_the_file_is_rewritten() {
    let bucket = moto().bucket("creds");
    let (a, b) = (pattern(900, 200_000), pattern(901, 300_000));
    moto().put(&bucket, "a.bin", &a);
    moto().put(&bucket, "b.bin", &b);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("credentials.json");
    std::fs::write(&file, credentials("e2e-key-1", "2099-01-01T00:00:00Z")).unwrap();
    let path = file.to_str().unwrap();
    // The file only: no AWS_* keys to fall back on.
    let fleet = Fleet::start(
        1,
        &[("MEMARTS_CREDENTIALS_FILE", path), ("AWS_ACCESS_KEY_ID", ""), ("AWS_SECRET_ACCESS_KEY", "")],
    );
    log_with(&fleet, &format!("S3 credentials from the credentials file {path}, expiring at 2099-01-01"));
    let client = fleet.client(64 << 10);
    assert!(client.read(&format!("s3://{bucket}/a.bin")).unwrap() == a, "a.bin differs");

    // A refresher caught halfway through writing the file: the slot goes on with the credential it
    // has (valid until 2099) and says why, naming the file.
    std::fs::write(&file, &credentials("e2e-key-2", "2099-01-02T00:00:00Z")[..60]).unwrap();
    std::thread::sleep(Duration::from_millis(1100)); // a slot looks at the file at most once a second
    assert!(client.read(&format!("s3://{bucket}/b.bin")).unwrap() == b, "b.bin differs");
    let log = log_with(&fleet, "not valid JSON");
    assert!(log.contains(&format!("credentials file {path}: it is not valid JSON")), "{log}");
    assert!(log.contains("still using the credential read before"), "{log}");

    let status = fleet.memarts(&["status", "--json"]);
    assert!(status.status.success(), "{}", text(&status.stderr));
    for (what, seen) in [
        ("the proxy log", log),
        ("the origin request log", std::fs::read_to_string(fleet.run_dir.join("origin-0.log")).unwrap()),
        ("fleet.json", std::fs::read_to_string(fleet.run_dir.join("fleet.json")).unwrap()),
        ("memarts status", text(&status.stdout) + &text(&status.stderr)),
    ] {
        assert_no_secret(what, &seen);
    }
}

#[test]
fn start_proxy_fails_on_a_missing_or_invalid_credentials_file_naming_it() {
    let fleet = Fleet::new(&[]);
    let file = |name: &str, content: &str| {
        let path = fleet.dir.path().join(name);
        std::fs::write(&path, content).unwrap();
        path
    };
    let missing = fleet.dir.path().join("absent.json");
    let half_written = file("half.json", &credentials("k", "2099-01-01T00:00:00Z")[..70]);
    let no_secret = file("no-secret.json", &format!(r#"{{"AccessKeyId": "k", "SecurityToken": "{TOKEN}"}}"#));
    let expired = file("expired.json", &credentials("k", "2020-01-01T00:00:00+08:00"));
    let cases: [(&Path, &str); 4] = [
        (&missing, "cannot read it"),
        (&half_written, "it is not valid JSON"),
        (&no_secret, "AccessKeySecret is missing"),
        (&expired, "the credential expired at 2019-12-31T16:00:00Z"),
    ];
    for (i, (path, why)) in cases.into_iter().enumerate() {
        // Both ways of naming the file: the option and the environment.
        let out = if i % 2 == 0 {
            fleet.memarts(&["start_proxy", "1", "--credentials-file", path.to_str().unwrap()])
        } else {
            fleet.command(&["start_proxy", "1"]).env("MEMARTS_CREDENTIALS_FILE", path).output().unwrap()
        };
        let stderr = text(&out.stderr);
        assert!(!out.status.success(), "start_proxy with {} succeeded", path.display());
        assert!(stderr.contains(&format!("credentials file {}: {why}", path.display())), "{stderr}");
        assert_no_secret("the start_proxy error", &(stderr + &text(&out.stdout)));
        assert!(!fleet.run_dir.join("proxy-0.pid").exists(), "a slot was started");
    }
}
