//! Tests of `credentials`.

use std::sync::atomic::{AtomicU64, Ordering};

use super::*;
use crate::config::OriginConfig;
use crate::origin::{Origin, OriginError};

const SECRET: &str = "SECRET-d41d8cd98f00b204";
const TOKEN: &str = "TOKEN-e9800998ecf8427e";

fn at(text: &str) -> SystemTime {
    chrono::DateTime::parse_from_rfc3339(text).unwrap().into()
}

/// A credentials file's text; `n` tells credentials apart.
fn file_text(n: u32, expiration: Option<&str>) -> String {
    let expiration = expiration.map(|e| format!(r#", "Expiration": "{e}""#)).unwrap_or_default();
    let (key, secret, token) = (format!("KEY-{n}"), format!("{SECRET}-{n}"), format!("{TOKEN}-{n}"));
    let fields =
        format!(r#""AccessKeyId": "{key}", "AccessKeySecret": "{secret}", "SecurityToken": "{token}""#);
    format!("{{{fields}{expiration}}}")
}

/// Replaces the file the way refreshers do (temp file, then rename).
fn write(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// A wall clock the test moves, in seconds since the epoch.
fn clock(start: &str) -> (Clock, Arc<AtomicU64>) {
    let secs = Arc::new(AtomicU64::new(at(start).duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs()));
    let read = secs.clone();
    let clock: Clock =
        Arc::new(move || SystemTime::UNIX_EPOCH + Duration::from_secs(read.load(Ordering::SeqCst)));
    (clock, secs)
}

fn set(secs: &AtomicU64, time: &str) {
    secs.store(at(time).duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs(), Ordering::SeqCst);
}

/// A provider on a file holding credential `n`, that looks at the file on every request.
fn provider(dir: &tempfile::TempDir, text: &str, clock: Clock) -> FileCredentialProvider {
    let path = dir.path().join("credentials.json");
    write(&path, text);
    FileCredentialProvider::open_with_clock(path, clock).unwrap().with_recheck_interval(Duration::ZERO)
}

async fn key_of(p: &FileCredentialProvider) -> String {
    p.credential().await.unwrap().key_id.clone()
}

/// Pretends the file did not change since it was last read, as on a file system whose
/// timestamps are too coarse to show it: only expiry can make the provider read it again.
async fn hide_change(p: &FileCredentialProvider) {
    p.refresh.lock().await.stamp = Stamp::of(&std::fs::metadata(p.path()).unwrap());
}

fn assert_no_secret(text: &str) {
    assert!(!text.contains(SECRET), "the secret leaked: {text}");
    assert!(!text.contains(TOKEN), "the token leaked: {text}");
}

/// Everything logged while it lives, for the current thread. (tracing caches per call site
/// whether anyone listens; a call site that another test thread reaches first may be missed,
/// so only assert on messages no other test logs.)
struct Logs(Arc<Mutex<Vec<u8>>>, #[allow(dead_code)] tracing::subscriber::DefaultGuard);

impl Logs {
    fn capture() -> Logs {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let sink = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || Sink(sink.clone()))
            .with_ansi(false)
            .with_max_level(tracing::Level::DEBUG)
            .finish();
        Logs(buf, tracing::subscriber::set_default(subscriber))
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

struct Sink(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Sink {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn parses_every_field_and_the_optional_ones_may_be_absent() {
    let full = parse(file_text(1, Some("2024-08-20T00:00:00Z")).as_bytes()).unwrap();
    assert_eq!(full.credential.key_id, "KEY-1");
    assert_eq!(full.credential.secret_key, format!("{SECRET}-1"));
    assert_eq!(full.credential.token, Some(format!("{TOKEN}-1")));
    assert_eq!(full.expires, Some(at("2024-08-20T00:00:00Z")));

    let minimal = parse(br#"{"AccessKeyId": "id", "AccessKeySecret": "s"}"#).unwrap();
    assert_eq!(minimal.credential.token, None);
    assert_eq!(minimal.expires, None, "without Expiration the credential never expires");

    // Empty or null optional fields mean absent, as in the OSS connector; unknown fields are ignored.
    let empty = parse(
        br#"{"AccessKeyId": "id", "AccessKeySecret": "s", "SecurityToken": "", "Expiration": null,
            "x": 1}"#,
    )
    .unwrap();
    assert_eq!((empty.credential.token.clone(), empty.expires), (None, None));

    // RFC 3339 with an offset and fractional seconds.
    let offset = parse(
        br#"{"AccessKeyId": "id", "AccessKeySecret": "s", "Expiration": "2024-08-20T08:00:00.5+08:00"}"#,
    )
    .unwrap();
    assert_eq!(offset.expires, Some(at("2024-08-20T00:00:00Z") + Duration::from_millis(500)));
}

#[test]
fn an_expiration_with_an_offset_is_the_same_instant_and_times_print_in_utc() {
    // 2024-08-20T00:00:00Z, counted without any date parser.
    let instant = SystemTime::UNIX_EPOCH + Duration::from_secs(1_724_112_000);
    for text in [
        "2024-08-20T00:00:00Z",
        "2024-08-20T08:00:00+08:00",
        "2024-08-19T19:00:00-05:00",
        "2024-08-20T00:00:00+00:00",
    ] {
        let loaded = parse(file_text(1, Some(text)).as_bytes()).unwrap();
        assert_eq!(loaded.expires, Some(instant), "{text}");
    }
    assert_eq!(at("2024-08-20T08:00:00+08:00"), at("2024-08-20T00:00:00Z"));
    // Messages and logs show whole seconds in UTC, the fraction cut off.
    assert_eq!(fmt_time(instant), "2024-08-20T00:00:00Z");
    assert_eq!(fmt_time(instant + Duration::from_millis(999)), "2024-08-20T00:00:00Z");
    assert_eq!(describe_expiry(Some(instant)), "expiring at 2024-08-20T00:00:00Z");
}

#[test]
fn bad_files_are_errors_naming_the_file_and_the_field_never_a_value() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("creds.json");
    let (s, old) = (SECRET, "2020-01-01T00:00:00Z");
    let cases = [
        (format!(r#"{{"AccessKeyId": "id", "AccessKeySecret": "{s}"#), "not valid JSON"),
        (String::new(), "not valid JSON"),
        (format!(r#"["{s}"]"#), "not a JSON object"),
        (r#"{"AccessKeyId": "id"}"#.into(), "AccessKeySecret is missing"),
        (format!(r#"{{"AccessKeySecret": "{s}"}}"#), "AccessKeyId is missing"),
        (format!(r#"{{"AccessKeyId": "", "AccessKeySecret": "{s}"}}"#), "AccessKeyId must be a non-empty"),
        (r#"{"AccessKeyId": "id", "AccessKeySecret": 1234567}"#.into(), "AccessKeySecret must be"),
        (
            format!(r#"{{"AccessKeyId": "id", "AccessKeySecret": "{s}", "SecurityToken": ["{TOKEN}"]}}"#),
            "SecurityToken must be a string",
        ),
        (
            format!(r#"{{"AccessKeyId": "id", "AccessKeySecret": "{s}", "Expiration": "{s}"}}"#),
            "Expiration is not an RFC 3339 time",
        ),
        (
            format!(r#"{{"AccessKeyId": "id", "AccessKeySecret": "{s}", "Expiration": "{old}"}}"#),
            "the credential expired at 2020-01-01T00:00:00Z",
        ),
        (format!(r#"{{"AccessKeyId": "id", "AccessKeySecret": "{}"}}"#, "x".repeat(70_000)), "larger than"),
    ];
    for (text, want) in cases {
        write(&path, &text);
        let err = FileCredentialProvider::open(&path).unwrap_err();
        let shown = format!("{err} / {err:?}");
        assert!(shown.starts_with(&format!("credentials file {}: ", path.display())), "{shown}");
        assert!(shown.contains(want), "{want:?} not in {shown}");
        assert_no_secret(&shown);
    }
    let err = FileCredentialProvider::open(dir.path().join("absent.json")).unwrap_err();
    assert!(err.to_string().contains("absent.json: cannot read it"), "{err}");
}

#[tokio::test]
async fn rereads_the_file_when_it_changes_looking_at_most_once_per_interval() {
    let dir = tempfile::tempdir().unwrap();
    let p = provider(&dir, &file_text(1, None), Arc::new(SystemTime::now));
    assert_eq!(key_of(&p).await, "KEY-1");
    write(p.path(), &file_text(2, None));
    assert_eq!(key_of(&p).await, "KEY-2", "a changed file is read again");

    let p = p.with_recheck_interval(Duration::from_millis(300));
    write(p.path(), &file_text(3, None));
    assert_eq!(key_of(&p).await, "KEY-2", "the file is not looked at within the interval");
    tokio::time::sleep(Duration::from_millis(350)).await;
    assert_eq!(key_of(&p).await, "KEY-3");
}

#[tokio::test]
async fn rereads_a_credential_about_to_expire_even_if_the_file_looks_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let (clock, now) = clock("2030-01-01T00:00:00Z");
    let p = provider(&dir, &file_text(1, Some("2030-01-01T01:00:00Z")), clock);
    write(p.path(), &file_text(2, Some("2030-01-01T02:00:00Z")));
    hide_change(&p).await;
    assert_eq!(key_of(&p).await, "KEY-1", "not due yet, and the file looks unchanged");
    set(&now, "2030-01-01T00:54:00Z");
    assert_eq!(key_of(&p).await, "KEY-1", "6 minutes before expiry: not due yet");
    set(&now, "2030-01-01T00:56:00Z");
    assert_eq!(key_of(&p).await, "KEY-2", "within the 5 minute margin: read again");
    assert_eq!(p.expires(), Some(at("2030-01-01T02:00:00Z")));
}

#[tokio::test]
async fn rereads_after_the_credential_expired() {
    let dir = tempfile::tempdir().unwrap();
    let (clock, now) = clock("2030-01-01T00:00:00Z");
    let p = provider(&dir, &file_text(1, Some("2030-01-01T01:00:00Z")), clock);
    write(p.path(), &file_text(2, Some("2030-01-01T03:00:00Z")));
    hide_change(&p).await;
    set(&now, "2030-01-01T01:00:01Z");
    assert_eq!(key_of(&p).await, "KEY-2");
}

#[tokio::test]
async fn a_renewal_that_lands_within_the_interval_before_expiry_is_read_at_expiry() {
    let dir = tempfile::tempdir().unwrap();
    let (clock, now) = clock("2030-01-01T00:00:00Z");
    let p = provider(&dir, &file_text(1, Some("2030-01-01T01:00:00Z")), clock)
        .with_recheck_interval(Duration::from_secs(3600));
    set(&now, "2030-01-01T00:59:00Z");
    assert_eq!(key_of(&p).await, "KEY-1", "due, looked at: not renewed yet");
    write(p.path(), &file_text(2, Some("2030-01-01T02:00:00Z")));
    set(&now, "2030-01-01T01:00:00Z");
    assert_eq!(key_of(&p).await, "KEY-2", "expired: the file is looked at again within the interval");
}

/// Found by the reliability campaign (keys of 4 s renewed 2 s before they expire): looking once
/// a second, a slot went on signing with the old key for up to a second after the new one
/// landed, and a request of a loaded machine reached the origin after the old key expired.
#[tokio::test]
async fn a_credential_due_for_renewal_is_looked_at_every_tenth_of_a_second() {
    let dir = tempfile::tempdir().unwrap();
    let (clock, now) = clock("2030-01-01T00:00:00Z");
    let p = provider(&dir, &file_text(1, Some("2030-01-01T01:00:00Z")), clock)
        .with_recheck_interval(Duration::from_secs(3600));
    write(p.path(), &file_text(2, Some("2030-01-01T02:00:00Z")));
    assert_eq!(key_of(&p).await, "KEY-1", "not due: the file is not looked at within the interval");
    set(&now, "2030-01-01T00:59:00Z");
    tokio::time::sleep(DUE_RECHECK_INTERVAL + Duration::from_millis(50)).await;
    assert_eq!(key_of(&p).await, "KEY-2", "due: looked at again after a tenth of a second");
    tokio::time::sleep(DUE_RECHECK_INTERVAL + Duration::from_millis(50)).await;
    write(p.path(), &file_text(3, Some("2030-01-01T03:00:00Z")));
    assert_eq!(key_of(&p).await, "KEY-2", "renewed, so not due: the interval again");
}

#[tokio::test]
async fn a_credential_the_file_does_not_renew_fails_once_it_expired() {
    let dir = tempfile::tempdir().unwrap();
    let (clock, now) = clock("2030-01-01T00:00:00Z");
    let p = provider(&dir, &file_text(1, Some("2030-01-01T01:00:00Z")), clock);
    set(&now, "2030-01-01T00:58:00Z");
    assert_eq!(key_of(&p).await, "KEY-1", "due, read again, the same: still valid");
    set(&now, "2030-01-01T01:00:00Z");
    let err = p.credential().await.unwrap_err().to_string();
    let path = p.path().display();
    assert_eq!(err, format!("credentials file {path}: the credential expired at 2030-01-01T01:00:00Z"));
}

#[tokio::test]
async fn short_lived_credentials_are_read_again_at_half_their_remaining_lifetime() {
    let dir = tempfile::tempdir().unwrap();
    let (clock, now) = clock("2030-01-01T00:00:00Z");
    let p = provider(&dir, &file_text(1, Some("2030-01-01T00:00:10Z")), clock);
    assert_eq!(p.lock_state().refresh_at, Some(at("2030-01-01T00:00:05Z")));
    write(p.path(), &file_text(2, Some("2030-01-01T00:00:30Z")));
    hide_change(&p).await;
    set(&now, "2030-01-01T00:00:04Z");
    assert_eq!(key_of(&p).await, "KEY-1");
    set(&now, "2030-01-01T00:00:05Z");
    assert_eq!(key_of(&p).await, "KEY-2");
    assert_eq!(p.lock_state().refresh_at, Some(at("2030-01-01T00:00:17.5Z")));
}

#[test]
fn keeps_the_last_good_credential_while_the_file_is_unreadable_then_fails_once_it_expired() {
    let logs = Logs::capture();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let (clock, now) = clock("2030-01-01T00:00:00Z");
        let p = provider(&dir, &file_text(1, Some("2030-01-01T01:00:00Z")), clock);
        let path = p.path().to_path_buf();

        std::fs::remove_file(&path).unwrap();
        assert_eq!(key_of(&p).await, "KEY-1", "missing file");
        assert_eq!(key_of(&p).await, "KEY-1");
        std::fs::write(&path, &file_text(2, None)[..40]).unwrap();
        assert_eq!(key_of(&p).await, "KEY-1", "half-written file");
        assert_eq!(key_of(&p).await, "KEY-1");
        write(&path, &file_text(3, Some("2029-12-31T00:00:00Z")));
        assert_eq!(key_of(&p).await, "KEY-1", "a file holding an older, expired credential");
        let warnings = logs.text().matches("still using the credential read before").count();
        assert_eq!(warnings, 3, "one warning per distinct failure:\n{}", logs.text());
        assert!(logs.text().contains("cannot read it"), "{}", logs.text());
        assert!(logs.text().contains("not valid JSON"), "{}", logs.text());

        std::fs::write(&path, &file_text(4, None)[..40]).unwrap();
        set(&now, "2030-01-01T01:00:00Z");
        assert!(p.credential().await.is_err());
        let err = p.credential().await.unwrap_err().to_string();
        assert_eq!(logs.text().matches(&err).count(), 1, "logged once:\n{}", logs.text());
        assert!(err.starts_with(&format!("credentials file {}: ", path.display())), "{err}");
        assert!(err.contains("the credential expired at 2030-01-01T01:00:00Z"), "{err}");
        assert!(err.contains("no newer one could be read: it is not valid JSON"), "{err}");
        assert_no_secret(&err);

        // Through object_store and the origin, the same message, typed and not retried.
        let store_err = p.get_credential().await.unwrap_err();
        let origin_err = OriginError::from_store(store_err);
        assert!(matches!(origin_err, OriginError::Credentials(_)), "{origin_err:?}");
        assert!(!origin_err.is_retryable());
        assert!(origin_err.to_string().contains(&err), "{origin_err}");

        write(&path, &file_text(5, None));
        assert_eq!(key_of(&p).await, "KEY-5", "a good file brings it back without a restart");
    });
    assert_no_secret(&logs.text());
}

#[tokio::test]
async fn debug_output_never_shows_the_secret_or_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let p = Arc::new(provider(&dir, &file_text(1, Some("2099-01-01T00:00:00Z")), Arc::new(SystemTime::now)));
    let shown = format!("{p:?}");
    assert!(shown.contains("credentials.json") && shown.contains("2099-01-01T00:00:00Z"), "{shown}");
    assert_no_secret(&shown);
    // The S3 client prints its provider in its own Debug output.
    let store = object_store::aws::AmazonS3Builder::new()
        .with_bucket_name("b")
        .with_region("us-east-1")
        .with_credentials(p.clone())
        .build()
        .unwrap();
    let shown = format!("{store:?}");
    assert!(shown.contains("FileCredentialProvider"), "{shown}");
    assert_no_secret(&shown);
    assert_no_secret(&format!("{:?}", p.credential().await.unwrap()));
}

#[tokio::test]
async fn an_origin_signs_with_the_file_and_fails_at_once_when_its_credential_expired() {
    let dir = tempfile::tempdir().unwrap();
    let (clock, now) = clock("2030-01-01T00:00:00Z");
    let p = provider(&dir, &file_text(1, Some("2030-01-01T01:00:00Z")), clock);
    set(&now, "2030-01-01T02:00:00Z");
    let cfg = OriginConfig {
        // Nothing listens there: a request that went out would fail differently, and be retried.
        endpoint: Some("http://127.0.0.1:9".into()),
        allow_http: true,
        max_attempts: 3,
        backoff_base_ms: 1,
        ..OriginConfig::default()
    };
    let origin = Origin::with_credential_provider(cfg, Arc::new(p));
    let url = memarts_protocol::ObjectUrl::parse("s3://b/k").unwrap();
    let err = origin.head(&url).await.unwrap_err();
    assert!(matches!(err, OriginError::Credentials(_)), "{err:?}");
    assert!(err.to_string().contains("credentials.json: the credential expired"), "{err}");
    assert_eq!(origin.stats.retries.load(std::sync::atomic::Ordering::SeqCst), 0);
}

#[test]
fn from_env_takes_the_file_and_names_it_when_it_is_unusable() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("credentials.json");
    let cfg = OriginConfig { credentials_file: Some(path.clone()), ..OriginConfig::default() };
    let err = Origin::from_env(cfg.clone()).err().expect("a missing file is an error");
    assert!(err.to_string().contains(&format!("{}: cannot read it", path.display())), "{err}");
    write(&path, &file_text(1, None));
    let origin = Origin::from_env(cfg).unwrap();
    assert!(origin.credentials.is_some());
}
