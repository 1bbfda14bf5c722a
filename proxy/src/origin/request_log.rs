//! The origin request log (MoXing's `MOX_OBS_CLIENT_LOG`): one line per attempt, with the time,
//! operation, target, attempt number, outcome and duration. Credentials never appear in it.
//!
//! The run dir is often a tmpfs (memory), and a job that reads millions of objects makes millions of
//! requests (about 80 bytes of log each), so the log is bounded: once its file holds
//! [`MAX_BYTES`], it is renamed to `<name>.1` (replacing the one before) and a new file is started.
//! A slot's log thus takes at most twice [`MAX_BYTES`], and holds at least the last [`MAX_BYTES`]
//! of requests.

use std::fmt::Display;
use std::fs::File;
use std::io::{self, LineWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

/// Bytes a log file holds before it is rotated (about 400,000 requests).
pub const MAX_BYTES: u64 = 32 << 20;

#[derive(Debug)]
pub struct RequestLog {
    path: PathBuf,
    max_bytes: u64,
    file: Mutex<Open>,
}

#[derive(Debug)]
struct Open {
    out: LineWriter<File>,
    /// Bytes in the file: what it held when opened plus what was written since.
    bytes: u64,
}

fn open(path: &Path) -> io::Result<Open> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new().create(true).append(true).mode(0o600).open(path)?;
    let bytes = file.metadata()?.len();
    Ok(Open { out: LineWriter::new(file), bytes })
}

/// Where a full log file goes: `<path>.1`.
pub fn rotated_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".1");
    PathBuf::from(name)
}

impl RequestLog {
    /// Appends to `path` (created 0600), rotated at [`MAX_BYTES`].
    pub fn open(path: &Path) -> io::Result<RequestLog> {
        RequestLog::open_with_limit(path, MAX_BYTES)
    }

    /// [`RequestLog::open`] rotated at `max_bytes` (tests).
    pub fn open_with_limit(path: &Path, max_bytes: u64) -> io::Result<RequestLog> {
        Ok(RequestLog { path: path.to_path_buf(), max_bytes, file: Mutex::new(open(path)?) })
    }

    pub fn record(&self, op: &str, target: &dyn Display, attempt: u32, outcome: &str, took: Duration) {
        let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
        let line = format!(
            "{}.{:03} {op} {target} attempt={attempt} {outcome} {}ms\n",
            now.as_secs(),
            now.subsec_millis(),
            took.as_millis()
        );
        let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        if file.bytes > 0 && file.bytes + line.len() as u64 > self.max_bytes {
            // A log that cannot be rotated keeps the file it has (and grows): requests are never
            // held up by their log.
            if std::fs::rename(&self.path, rotated_path(&self.path)).is_ok() {
                if let Ok(fresh) = open(&self.path) {
                    *file = fresh;
                }
            }
        }
        if file.out.write_all(line.as_bytes()).is_ok() {
            file.bytes += line.len() as u64;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_log_is_rotated_once_and_the_last_requests_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("origin-0.log");
        let log = RequestLog::open_with_limit(&path, 4096).unwrap();
        for i in 0..1000 {
            log.record("GET", &format!("s3://b/object-{i:04}"), 1, "ok", Duration::from_millis(3));
        }
        let current = std::fs::read_to_string(&path).unwrap();
        let previous = std::fs::read_to_string(rotated_path(&path)).unwrap();
        assert!(current.len() <= 4096 && previous.len() <= 4096, "{} {}", current.len(), previous.len());
        let files: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(files.len(), 2, "one current file and one rotated: {files:?}");
        // The newest request is the last line; the rotated file ends where the current one starts.
        assert!(current.lines().last().unwrap().contains("s3://b/object-0999 attempt=1 ok 3ms"), "{current}");
        let first: usize =
            current.lines().next().unwrap().split("object-").nth(1).unwrap()[..4].parse().unwrap();
        let last_before: usize =
            previous.lines().last().unwrap().split("object-").nth(1).unwrap()[..4].parse().unwrap();
        assert_eq!(last_before + 1, first);
    }

    #[test]
    fn a_reopened_log_counts_what_its_file_already_holds() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("origin-0.log");
        std::fs::write(&path, vec![b'x'; 4090]).unwrap();
        let log = RequestLog::open_with_limit(&path, 4096).unwrap();
        log.record("HEAD", &"s3://b/o", 1, "ok", Duration::ZERO);
        assert_eq!(
            std::fs::read(rotated_path(&path)).unwrap().len(),
            4090,
            "rotated before growing past the limit"
        );
        assert!(std::fs::read_to_string(&path).unwrap().starts_with(char::is_numeric));
    }
}
