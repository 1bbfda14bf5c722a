//! S3 credentials from a file that something else keeps fresh (promise O2): the format of the OSS
//! connector, `{"AccessKeyId", "AccessKeySecret", "SecurityToken"?, "Expiration"?}`, where a
//! credential without `Expiration` never expires.
//!
//! A refresher (an STS sidecar, a mounted secret) rewrites the file; a slot must pick the new
//! credential up without a restart. So the provider keeps the last good credential and goes back to
//! the file when it has changed (stat at most once per [`RECHECK_INTERVAL`]) or when the credential
//! is about to expire ([`REFRESH_MARGIN`], or half of its remaining lifetime when that is shorter, so
//! short-lived test credentials are refreshed too). A re-read that fails — the file gone, half
//! written, a bad field — keeps the last good credential while it is valid (warning once per distinct
//! reason); once it has expired, requests fail with an error naming the file and why.
//!
//! Nothing here ever formats the secret or the token (promise S4): errors name the file and the
//! field, never a value, and the `Debug` output shows the path and the expiration only.

use std::fmt;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use object_store::aws::AwsCredential;
use object_store::CredentialProvider;
use serde_json::Value;

/// How often, at most, a slot looks at the file for a change.
pub const RECHECK_INTERVAL: Duration = Duration::from_secs(1);
/// How often, at most, it looks once the credential is due for renewal (see [`REFRESH_MARGIN`]):
/// the refresher writes the next one about then, and every request signed with the old one after
/// that has less time left to reach the origin before the old one expires.
pub const DUE_RECHECK_INTERVAL: Duration = Duration::from_millis(100);
/// How long before its expiration a credential is re-read (at most half its remaining lifetime).
pub const REFRESH_MARGIN: Duration = Duration::from_secs(5 * 60);
/// A credentials file is a few hundred bytes; anything this large is something else.
const MAX_FILE_BYTES: u64 = 64 << 10;

/// The file and what is wrong with it. Its text never contains a value from the file.
#[derive(Debug, thiserror::Error)]
#[error("credentials file {}: {problem}", path.display())]
pub struct CredentialsError {
    pub path: PathBuf,
    pub problem: Problem,
}

/// What is wrong with a credentials file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Problem {
    #[error("cannot read it: {0}")]
    Unreadable(std::io::Error),
    #[error("it is larger than {MAX_FILE_BYTES} bytes, not a credentials file")]
    TooLarge,
    /// serde_json's syntax errors give a position, never the text around it.
    #[error("it is not valid JSON: {0}")]
    NotJson(serde_json::Error),
    #[error("it is not a JSON object")]
    NotAnObject,
    #[error("{0} is missing")]
    Missing(&'static str),
    #[error("{field} must be {expected}")]
    BadField { field: &'static str, expected: &'static str },
    #[error("Expiration is not an RFC 3339 time such as 2024-08-20T00:00:00Z: {0}")]
    BadExpiration(chrono::ParseError),
    /// A re-read found a credential that has expired already.
    #[error("it holds a credential that expired at {}", fmt_time(*.0))]
    HoldsExpired(SystemTime),
    #[error("the credential expired at {}{}", fmt_time(*at), because(reason))]
    Expired { at: SystemTime, reason: Option<String> },
}

/// RFC 3339 in UTC to the second, e.g. `2024-08-20T00:00:00Z` (fractions are cut, not rounded).
fn fmt_time(t: SystemTime) -> String {
    chrono::DateTime::<chrono::Utc>::from(t).to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

fn because(reason: &Option<String>) -> String {
    reason.as_ref().map(|r| format!(", and no newer one could be read: {r}")).unwrap_or_default()
}

/// The wall clock; tests move it.
type Clock = Arc<dyn Fn() -> SystemTime + Send + Sync>;

/// An `object_store` credential provider backed by a credentials file; give it to
/// [`Origin::with_credential_provider`](super::Origin::with_credential_provider) or to
/// `AmazonS3Builder::with_credentials`.
pub struct FileCredentialProvider {
    path: PathBuf,
    recheck: Duration,
    clock: Clock,
    /// What requests use; locked only briefly, never across an await.
    state: Mutex<State>,
    /// One look at the file at a time; the others wait for its outcome.
    refresh: tokio::sync::Mutex<Refresh>,
}

/// A parsed credentials file.
#[derive(Clone, PartialEq, Eq)]
struct Loaded {
    credential: Arc<AwsCredential>,
    expires: Option<SystemTime>,
}

struct State {
    current: Loaded,
    /// When to re-read the file even if it has not changed.
    refresh_at: Option<SystemTime>,
    /// When the file was last looked at: requests use `current` without looking at it for an
    /// interval after that.
    checked: Instant,
    /// Why the file could not be re-read, while that lasts.
    failure: Option<String>,
}

struct Refresh {
    /// The file as it was when `current` was read from it.
    stamp: Stamp,
    /// The failure last logged, so that each distinct one is logged once.
    warned: Option<String>,
}

/// What tells a rewritten file from the one read before: an atomic rename changes the inode, an
/// in-place rewrite the ctime (which, unlike the mtime, cannot be set back) and usually the length.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Stamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    fn of(m: &std::fs::Metadata) -> Stamp {
        Stamp {
            dev: m.dev(),
            ino: m.ino(),
            len: m.len(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        }
    }
}

impl FileCredentialProvider {
    /// Reads `path` now. A file that is missing, invalid or holds an expired credential is an error:
    /// a slot that would sign every request with it should not start.
    pub fn open(path: impl Into<PathBuf>) -> Result<FileCredentialProvider, CredentialsError> {
        Self::open_with_clock(path.into(), Arc::new(SystemTime::now))
    }

    fn open_with_clock(path: PathBuf, clock: Clock) -> Result<FileCredentialProvider, CredentialsError> {
        let fail = |problem| CredentialsError { path: path.clone(), problem };
        let (stamp, bytes) = read_file(&path).map_err(fail)?;
        let loaded = parse(&bytes).map_err(fail)?;
        let now = clock();
        if let Some(at) = loaded.expires.filter(|at| now >= *at) {
            return Err(fail(Problem::Expired { at, reason: None }));
        }
        let state = State {
            refresh_at: refresh_at(&loaded, now),
            current: loaded,
            checked: Instant::now(),
            failure: None,
        };
        Ok(FileCredentialProvider {
            path,
            recheck: RECHECK_INTERVAL,
            clock,
            state: Mutex::new(state),
            refresh: tokio::sync::Mutex::new(Refresh { stamp, warned: None }),
        })
    }

    /// Looks at the file at most once per `interval` instead of [`RECHECK_INTERVAL`] (tests).
    pub fn with_recheck_interval(mut self, interval: Duration) -> FileCredentialProvider {
        self.recheck = interval;
        self
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// When the credential in use expires; `None`: never.
    pub fn expires(&self) -> Option<SystemTime> {
        self.lock_state().current.expires
    }

    /// The credential to sign the next request with, re-reading the file when it is due.
    pub async fn credential(&self) -> Result<Arc<AwsCredential>, CredentialsError> {
        if let Some(answer) = self.answer_if_checked() {
            return answer;
        }
        let mut refresh = self.refresh.lock().await;
        // Whoever held the lock before us may just have looked.
        if let Some(answer) = self.answer_if_checked() {
            return answer;
        }
        let now = (self.clock)();
        let due = self.lock_state().refresh_at.is_some_and(|at| now >= at);
        let (path, known) = (self.path.clone(), refresh.stamp);
        let outcome = tokio::task::spawn_blocking(move || reread(&path, known, due))
            .await
            .unwrap_or_else(|e| Err(Problem::Unreadable(std::io::Error::other(e.to_string()))));
        self.settle(&mut refresh, outcome, now)
    }

    fn lock_state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The answer from what we know, if the file was looked at recently enough. Never an expired
    /// credential: then the file is looked at again whatever the interval, since its renewal may
    /// have landed since the last look (found by the reliability campaign: a credential renewed
    /// less than an interval before it expired failed requests until the next look).
    fn answer_if_checked(&self) -> Option<Result<Arc<AwsCredential>, CredentialsError>> {
        let state = self.lock_state();
        let now = (self.clock)();
        let expired = state.current.expires.is_some_and(|at| now >= at);
        let due = state.refresh_at.is_some_and(|at| now >= at);
        let interval = if due { self.recheck.min(DUE_RECHECK_INTERVAL) } else { self.recheck };
        (state.checked.elapsed() < interval && !expired).then(|| self.answer(&state, now))
    }

    fn answer(&self, state: &State, now: SystemTime) -> Result<Arc<AwsCredential>, CredentialsError> {
        match state.current.expires {
            Some(at) if now >= at => Err(CredentialsError {
                path: self.path.clone(),
                problem: Problem::Expired { at, reason: state.failure.clone() },
            }),
            _ => Ok(state.current.credential.clone()),
        }
    }

    /// Takes in what a look at the file found (`Ok(None)`: nothing new) and answers.
    fn settle(
        &self,
        refresh: &mut Refresh,
        outcome: Result<Option<(Stamp, Loaded)>, Problem>,
        now: SystemTime,
    ) -> Result<Arc<AwsCredential>, CredentialsError> {
        let mut state = self.lock_state();
        state.checked = Instant::now();
        let problem = match outcome {
            Ok(None) => None,
            // Read again because it was due, and not renewed yet: nothing wrong with the file.
            Ok(Some((stamp, loaded))) if loaded == state.current => {
                refresh.stamp = stamp;
                None
            }
            Ok(Some((stamp, loaded))) => match loaded.expires {
                Some(at) if now >= at => Some(Problem::HoldsExpired(at)),
                _ => {
                    tracing::info!(
                        "credentials file {}: read a new credential, {}",
                        self.path.display(),
                        describe_expiry(loaded.expires)
                    );
                    refresh.stamp = stamp;
                    state.refresh_at = refresh_at(&loaded, now);
                    state.current = loaded;
                    None
                }
            },
            Err(problem) => Some(problem),
        };
        state.failure = problem.as_ref().map(|p| p.to_string());
        let answer = self.answer(&state, now);
        // Logged once per distinct message, while requests go on asking once a second.
        let warning = match (&answer, &state.failure) {
            (Err(e), _) => Some(e.to_string()),
            (Ok(_), Some(reason)) => Some(format!(
                "credentials file {}: {reason}; still using the credential read before, {}",
                self.path.display(),
                describe_expiry(state.current.expires)
            )),
            (Ok(_), None) => None,
        };
        if warning.is_some() && warning != refresh.warned {
            tracing::warn!("{}", warning.as_deref().unwrap_or_default());
        }
        refresh.warned = warning;
        answer
    }
}

/// `expiring at ...` or `which never expires`, for logs.
pub fn describe_expiry(expires: Option<SystemTime>) -> String {
    match expires {
        Some(at) => format!("expiring at {}", fmt_time(at)),
        None => "which never expires".into(),
    }
}

/// Re-read a credential this long before it expires: [`REFRESH_MARGIN`], or half of what is left of
/// its lifetime when that is shorter.
fn refresh_at(loaded: &Loaded, now: SystemTime) -> Option<SystemTime> {
    let at = loaded.expires?;
    let left = at.duration_since(now).unwrap_or_default();
    Some(at - REFRESH_MARGIN.min(left / 2))
}

/// The file's credential if it changed since `known` or if `due`; `Ok(None)` otherwise. Blocking.
fn reread(path: &Path, known: Stamp, due: bool) -> Result<Option<(Stamp, Loaded)>, Problem> {
    let now = Stamp::of(&std::fs::metadata(path).map_err(Problem::Unreadable)?);
    if now == known && !due {
        return Ok(None);
    }
    let (stamp, bytes) = read_file(path)?;
    Ok(Some((stamp, parse(&bytes)?)))
}

/// The file's bytes and the stamp of what was read (taken from the open file, not the path).
fn read_file(path: &Path) -> Result<(Stamp, Vec<u8>), Problem> {
    let file = std::fs::File::open(path).map_err(Problem::Unreadable)?;
    let stamp = Stamp::of(&file.metadata().map_err(Problem::Unreadable)?);
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes).map_err(Problem::Unreadable)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(Problem::TooLarge);
    }
    Ok((stamp, bytes))
}

/// Parses a credentials file. Goes through `serde_json::Value` rather than a derived struct: serde's
/// type errors quote the offending value, which could be the secret.
fn parse(bytes: &[u8]) -> Result<Loaded, Problem> {
    let value: Value = serde_json::from_slice(bytes).map_err(Problem::NotJson)?;
    let fields = value.as_object().ok_or(Problem::NotAnObject)?;
    let optional = |field: &'static str| match fields.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.trim().to_string()).filter(|s| !s.is_empty())),
        Some(_) => Err(Problem::BadField { field, expected: "a string" }),
    };
    let required = |field: &'static str| match optional(field) {
        Ok(Some(s)) => Ok(s),
        Ok(None) if matches!(fields.get(field), Some(Value::String(_))) => {
            Err(Problem::BadField { field, expected: "a non-empty string" })
        }
        Ok(None) => Err(Problem::Missing(field)),
        Err(_) => Err(Problem::BadField { field, expected: "a non-empty string" }),
    };
    let key_id = required("AccessKeyId")?;
    let secret_key = required("AccessKeySecret")?;
    let token = optional("SecurityToken")?;
    let expires = match optional("Expiration")? {
        // As in the OSS connector: no Expiration, or an empty one, never expires.
        None => None,
        Some(text) => {
            // Files written by hand carry local offsets (`+08:00`), so not only `Z`.
            let at = chrono::DateTime::parse_from_rfc3339(&text).map_err(Problem::BadExpiration)?;
            Some(SystemTime::from(at))
        }
    };
    Ok(Loaded { credential: Arc::new(AwsCredential { key_id, secret_key, token }), expires })
}

impl fmt::Debug for FileCredentialProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let expires = self.expires().map(fmt_time);
        f.debug_struct("FileCredentialProvider")
            .field("path", &self.path)
            .field("expires", &expires)
            .finish_non_exhaustive()
    }
}

#[async_trait::async_trait]
impl CredentialProvider for FileCredentialProvider {
    type Credential = AwsCredential;

    async fn get_credential(&self) -> object_store::Result<Arc<AwsCredential>> {
        self.credential().await.map_err(|e| object_store::Error::Generic { store: "S3", source: Box::new(e) })
    }
}

#[cfg(test)]
#[path = "credentials_tests.rs"]
mod tests;
