//! One parser per kind of value a variable holds. Each takes the trimmed, non-empty text and says
//! what was expected when it does not fit; [`crate::Settings`] adds the variable's name.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use nix::unistd::User;

/// What a value should have been, said of the value (`must be 0 or 1`, `is not a size (...)`);
/// [`crate::SettingsError`] puts the variable's name and the value before it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Expected(pub String);

impl From<&str> for Expected {
    fn from(text: &str) -> Expected {
        Expected(text.to_string())
    }
}

impl From<String> for Expected {
    fn from(text: String) -> Expected {
        Expected(text)
    }
}

/// The one boolean syntax of every flag: `1` / `true` or `0` / `false` (any case). Anything else,
/// `yes` included, is refused rather than guessed.
pub fn flag(text: &str) -> Result<bool, Expected> {
    match text.to_ascii_lowercase().as_str() {
        "1" | "true" => Ok(true),
        "0" | "false" => Ok(false),
        _ => Err("must be 0 or 1".into()),
    }
}

/// A whole number in `low..=high`.
pub fn whole<T: FromStr + PartialOrd + std::fmt::Display + Copy>(
    text: &str,
    low: T,
    high: T,
) -> Result<T, Expected> {
    let n: T = text.parse().map_err(|_| "is not a whole number".to_string())?;
    if n < low || n > high {
        return Err(format!("is outside {low}..={high}").into());
    }
    Ok(n)
}

/// A number of bytes (digits only) in `low..=high`.
pub fn bytes(text: &str, low: u64, high: u64) -> Result<u64, Expected> {
    let n: u64 = text.parse().map_err(|_| "is not a number of bytes".to_string())?;
    if !(low..=high).contains(&n) {
        return Err(format!("is outside {low}..={high} bytes").into());
    }
    Ok(n)
}

/// A size with an optional unit (`50GiB`, `512MiB`, `1TB`, `1048576`).
pub fn size(text: &str) -> Result<u64, Expected> {
    crate::size::parse_size(text).map_err(|_| "is not a size (use e.g. 50GiB, 512MiB, 1TB)".into())
}

/// A positive number of seconds, below a million.
pub fn seconds(text: &str) -> Result<Duration, Expected> {
    match text.parse::<f64>() {
        Ok(secs) if secs.is_finite() && secs > 0.0 && secs < 1e6 => Ok(Duration::from_secs_f64(secs)),
        _ => Err("must be a positive number of seconds".into()),
    }
}

/// Microseconds of socket polling, 0 to 10000 (0 turns polling off).
pub fn spin_us(text: &str) -> Result<Duration, Expected> {
    memarts_protocol::spin::parse_spin_us(text)
        .map_err(|_| "is not a number of microseconds between 0 and 10000".into())
}

pub fn path(text: &str) -> Result<PathBuf, Expected> {
    Ok(PathBuf::from(text))
}

pub fn text(text: &str) -> Result<String, Expected> {
    Ok(text.to_string())
}

/// Uids or user names separated by commas or spaces (`0, 1000`, `root`).
pub fn uids(text: &str) -> Result<Vec<u32>, Expected> {
    let mut uids = Vec::new();
    for item in text.split([',', ' ', '\t']).filter(|s| !s.is_empty()) {
        let uid = match item.parse::<u32>() {
            Ok(uid) => uid,
            Err(_) => match User::from_name(item) {
                Ok(Some(user)) => user.uid.as_raw(),
                _ => return Err(format!("has {item:?}, neither a uid nor a known user name").into()),
            },
        };
        uids.push(uid);
    }
    Ok(uids)
}

/// `obs://bucket/dir=/local/dir` pairs separated by `;`, longest prefix first (so
/// `obs://b/dir/sub` wins over `obs://b/dir`), trailing slashes dropped.
pub fn mounts(text: &str) -> Result<Vec<(String, String)>, Expected> {
    const REMOTE: [&str; 4] = ["s3://", "obs://", "oss://", "s3a://"];
    let mut mounts = Vec::new();
    for item in text.split(';').map(str::trim).filter(|s| !s.is_empty()) {
        let (prefix, local) = item.split_once('=').unwrap_or((item, ""));
        let lower = prefix.to_ascii_lowercase();
        if !REMOTE.iter().any(|r| lower.starts_with(r)) || local.is_empty() {
            return Err(format!("has {item:?}, not of the form obs://bucket/dir=/local/dir").into());
        }
        mounts.push((prefix.trim_end_matches('/').to_string(), local.trim_end_matches('/').to_string()));
    }
    mounts.sort_by_key(|(prefix, _)| std::cmp::Reverse(prefix.len()));
    Ok(mounts)
}

/// The fsspec protocols `memarts.fsspec` takes over (`MEMARTS_FSSPEC_ROUTE`): `1` / `true` for
/// `s3`, `obs` and `oss`; `0` / `false` for none; or a list of some of `s3`, `s3a`, `obs`, `oss`
/// separated by commas or spaces (`s3,obs`), lower-cased.
pub fn fsspec_protocols(text: &str) -> Result<Vec<String>, Expected> {
    const KNOWN: [&str; 4] = ["s3", "s3a", "obs", "oss"];
    if let Ok(all) = flag(text) {
        return Ok(if all { ["s3", "obs", "oss"].map(String::from).to_vec() } else { Vec::new() });
    }
    let mut protocols = Vec::new();
    for item in text.split([',', ' ', '\t']).filter(|s| !s.is_empty()) {
        let name = item.to_ascii_lowercase();
        if !KNOWN.contains(&name.as_str()) {
            return Err(format!("has {item:?}: use 1, 0 or protocols among s3, s3a, obs, oss").into());
        }
        if !protocols.contains(&name) {
            protocols.push(name);
        }
    }
    Ok(protocols)
}

/// Which SSD I/O engine a slot uses (`MEMARTS_IO_ENGINE`, config `io_engine`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IoEngineKind {
    /// io_uring when available, otherwise pread.
    #[default]
    Auto,
    /// io_uring, or an error when the kernel refuses it.
    IoUring,
    /// Blocking pread/pwrite on tokio's blocking pool.
    Pread,
}

/// A name that is none of the [`IoEngineKind`]s; the message lists those that are.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown I/O engine {text:?}: expected one of auto, io_uring (or uring), pread")]
pub struct UnknownIoEngine {
    /// The name as it was given.
    pub text: String,
}

impl FromStr for IoEngineKind {
    type Err = UnknownIoEngine;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(IoEngineKind::Auto),
            "io_uring" | "io-uring" | "uring" => Ok(IoEngineKind::IoUring),
            "pread" => Ok(IoEngineKind::Pread),
            _ => Err(UnknownIoEngine { text: text.to_string() }),
        }
    }
}

impl fmt::Display for IoEngineKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IoEngineKind::Auto => "auto",
            IoEngineKind::IoUring => "io_uring",
            IoEngineKind::Pread => "pread",
        })
    }
}

/// An I/O engine's name.
pub fn io_engine(text: &str) -> Result<IoEngineKind, Expected> {
    text.parse().map_err(|_| "is not an I/O engine: use auto, io_uring (or uring) or pread".into())
}

/// What a slot keeps when its cache is full (`MEMARTS_EVICTION`, config `eviction`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Eviction {
    /// LRU order with TinyLFU admission: a fetched chunk is kept only if it was read more often
    /// lately than the chunks it would push out, or if it was read before and they are no longer
    /// read (a dataset larger than the cache keeps a stable part resident; a new dataset replaces
    /// an old one within about two of its passes).
    #[default]
    TinyLfu,
    /// Plain LRU: every fetched chunk is kept, the least recently used make room.
    Lru,
}

/// A name that is none of the [`Eviction`] policies.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown eviction policy {text:?}: expected tinylfu or lru")]
pub struct UnknownEviction {
    /// The name as it was given.
    pub text: String,
}

impl FromStr for Eviction {
    type Err = UnknownEviction;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.trim().to_ascii_lowercase().as_str() {
            "tinylfu" => Ok(Eviction::TinyLfu),
            "lru" => Ok(Eviction::Lru),
            _ => Err(UnknownEviction { text: text.to_string() }),
        }
    }
}

impl fmt::Display for Eviction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Eviction::TinyLfu => "tinylfu",
            Eviction::Lru => "lru",
        })
    }
}

/// An eviction policy's name.
pub fn eviction(text: &str) -> Result<Eviction, Expected> {
    text.parse().map_err(|_| "is not an eviction policy: use tinylfu or lru".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_take_0_1_true_false_only() {
        for (t, v) in [("1", true), ("TRUE", true), ("0", false), ("false", false)] {
            assert_eq!(flag(t), Ok(v), "{t}");
        }
        for t in ["yes", "on", "2", "y"] {
            assert!(flag(t).is_err(), "{t}");
        }
    }

    #[test]
    fn numbers_sizes_and_lists() {
        assert_eq!(whole::<usize>("16", 1, 1024), Ok(16));
        assert!(whole::<usize>("0", 1, 1024).unwrap_err().0.contains("outside 1..=1024"));
        assert!(whole::<usize>("-1", 1, 256).is_err());
        assert_eq!(bytes("65536", 4096, 1 << 26), Ok(65536));
        assert!(bytes("1MB", 4096, 1 << 26).is_err());
        assert_eq!(size("2GiB"), Ok(2 << 30));
        assert_eq!(seconds("1.5"), Ok(Duration::from_millis(1500)));
        assert!(seconds("-3").is_err());
        let m = mounts("obs://b/dir=/a/; obs://b/dir/sub/=/b").unwrap();
        assert_eq!(m, vec![("obs://b/dir/sub".into(), "/b".into()), ("obs://b/dir".into(), "/a".into())]);
        assert!(mounts("obs://b/a:/cache/a").is_err());
        assert!(io_engine("mmap").unwrap_err().0.contains("io_uring"));
    }

    #[test]
    fn fsspec_protocols_take_a_flag_or_a_list() {
        assert_eq!(fsspec_protocols("1").unwrap(), ["s3", "obs", "oss"]);
        assert_eq!(fsspec_protocols("false").unwrap(), Vec::<String>::new());
        assert_eq!(fsspec_protocols("S3, obs,s3").unwrap(), ["s3", "obs"]);
        assert!(fsspec_protocols("s3,gcs").unwrap_err().0.contains("\"gcs\""));
    }

    #[test]
    fn kind_parses() {
        assert_eq!("auto".parse(), Ok(IoEngineKind::Auto));
        assert_eq!("io_uring".parse(), Ok(IoEngineKind::IoUring));
        assert_eq!("URING".parse(), Ok(IoEngineKind::IoUring));
        assert_eq!("pread".parse(), Ok(IoEngineKind::Pread));
        let err = "mmap".parse::<IoEngineKind>().unwrap_err();
        assert_eq!(err, UnknownIoEngine { text: "mmap".into() });
        let err = err.to_string();
        assert!(err.contains("mmap") && err.contains("pread"), "{err}");
        for kind in [IoEngineKind::Auto, IoEngineKind::IoUring, IoEngineKind::Pread] {
            assert_eq!(kind.to_string().parse(), Ok(kind));
        }
    }

    #[test]
    fn uid_lists_take_numbers_and_names() {
        assert_eq!(uids("0, 1000 65534").unwrap(), vec![0, 1000, 65534]);
        assert_eq!(uids("root").unwrap(), vec![0]);
        assert_eq!(uids("").unwrap(), Vec::<u32>::new());
        assert!(uids("no-such-user-here").unwrap_err().0.contains("no-such-user-here"));
    }
}
