//! The cluster secret file (S6): whoever holds the secret is a member of the pool, so it is read only
//! if it is a regular file of the proxy's own uid that no other user can read or write, and only
//! used if it holds at least [`MIN_SECRET_BITS`] of entropy, estimated from its alphabet
//! ([`Strength::of`]): a guessable secret lets anyone on the network into the pool.
//!
//! A text secret (valid UTF-8) is the text with surrounding ASCII whitespace (a trailing newline)
//! trimmed, as it always was; a binary one (not UTF-8) is taken as it is, every byte of it.

use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use memarts_settings::dir_trust::{own_uid, who};

use crate::cluster::auth::Secret;

/// Secrets estimated to hold fewer bits than this are refused.
pub const MIN_SECRET_BITS: f64 = 256.0;

/// Why a secret file is refused; each names the file and the fix (the whole message is
/// `ClusterError::Secret`'s, which names the file first).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SecretFileError {
    #[error("{0}")]
    Unreadable(std::io::Error),
    #[error("not a regular file")]
    NotAFile,
    #[error(
        "belongs to {}, not to {} that this proxy runs as: another user could have written it; \
         make it yours (`chown {me} {}`) or make a secret file of your own",
        who(*.owner), who(*.me), .path.display()
    )]
    Owner { path: PathBuf, owner: u32, me: u32 },
    #[error("{what} by other users (mode {mode:04o}); run `chmod 600 {}`", .path.display())]
    Exposed { path: PathBuf, mode: u32, what: &'static str },
    #[error(
        "holds about {} bits of entropy ({} {} at {:.1} bits each), fewer than the {MIN_SECRET_BITS} a \
         cluster secret needs; make one with `head -c 32 /dev/urandom | base64 > {path} && chmod 600 \
         {path}` and give every node the same file",
        .strength.bits() as u64, .strength.count, .strength.alphabet, .strength.bits_each,
        path = .path.display()
    )]
    Weak { path: PathBuf, strength: Strength },
}

/// How much a secret file's bytes can hold, estimated from the alphabet they are written in: a
/// random string of `count` symbols of an alphabet of 2^`bits_each` holds `count × bits_each` bits
/// (a string that only looks random holds less, which no estimate can tell).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Strength {
    pub count: usize,
    pub bits_each: f64,
    /// What the symbols are, for the message: "hex digits", "bytes", ...
    pub alphabet: &'static str,
}

impl Strength {
    /// The key a secret file's `bytes` make and its strength: a text secret trimmed and counted by
    /// its characters at 4 bits each if all are hex digits, 6 if all are base64 or base64url
    /// characters (`=` padding at the end not counted), log2 95 ≈ 6.57 if all are printable ASCII,
    /// 8 otherwise; a binary secret untrimmed, at 8 bits a byte.
    pub fn of(bytes: &[u8]) -> (Vec<u8>, Strength) {
        let Ok(text) = std::str::from_utf8(bytes) else {
            return (bytes.to_vec(), Strength { count: bytes.len(), bits_each: 8.0, alphabet: "bytes" });
        };
        let text = text.trim_matches(|c: char| c.is_ascii_whitespace());
        let unpadded = text.strip_suffix("==").or_else(|| text.strip_suffix('=')).unwrap_or(text);
        let is_base64 = |c: char| c.is_ascii_alphanumeric() || matches!(c, '+' | '/' | '-' | '_');
        let strength = if text.chars().all(|c| c.is_ascii_hexdigit()) {
            Strength { count: text.len(), bits_each: 4.0, alphabet: "hex digits" }
        } else if unpadded.chars().all(is_base64) {
            Strength { count: unpadded.len(), bits_each: 6.0, alphabet: "base64 characters" }
        } else if text.chars().all(|c| c.is_ascii_graphic() || c == ' ') {
            Strength { count: text.len(), bits_each: 95f64.log2(), alphabet: "printable ASCII characters" }
        } else {
            Strength { count: text.chars().count(), bits_each: 8.0, alphabet: "characters" }
        };
        (text.as_bytes().to_vec(), strength)
    }

    pub fn bits(&self) -> f64 {
        self.count as f64 * self.bits_each
    }
}

/// Reads the secret file at `path` and checks it (see the module docs): its owner and mode as the
/// file opened says (no race with a swap of the path), then its strength.
pub fn read_secret(path: &Path) -> Result<Secret, SecretFileError> {
    let mut file = std::fs::File::open(path).map_err(SecretFileError::Unreadable)?;
    let meta = file.metadata().map_err(SecretFileError::Unreadable)?;
    if !meta.is_file() {
        return Err(SecretFileError::NotAFile);
    }
    let path = path.to_path_buf();
    let (owner, me) = (meta.uid(), own_uid());
    if owner != me {
        return Err(SecretFileError::Owner { path, owner, me });
    }
    let mode = meta.mode() & 0o7777;
    let what = match (mode & 0o044 != 0, mode & 0o022 != 0) {
        (true, true) => Some("readable and writable"),
        (true, false) => Some("readable"),
        (false, true) => Some("writable"),
        (false, false) => None,
    };
    if let Some(what) = what {
        return Err(SecretFileError::Exposed { path, mode, what });
    }
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).map_err(SecretFileError::Unreadable)?;
    let (key, strength) = Strength::of(&bytes);
    if strength.bits() < MIN_SECRET_BITS {
        return Err(SecretFileError::Weak { path, strength });
    }
    Ok(Secret::from_bytes(key))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn bits(bytes: &[u8]) -> (f64, &'static str) {
        let strength = Strength::of(bytes).1;
        (strength.bits(), strength.alphabet)
    }

    #[test]
    fn the_estimate_follows_the_alphabet() {
        assert_eq!(bits(format!("{}\n", "a1".repeat(32)).as_bytes()), (256.0, "hex digits"));
        assert_eq!(bits("a1".repeat(31).as_bytes()), (248.0, "hex digits"));
        // 32 random bytes in base64: 43 characters and one `=`.
        assert_eq!(
            bits(format!("{}=\n", "aZ+/".repeat(10) + "xY0").as_bytes()),
            (258.0, "base64 characters")
        );
        assert_eq!(bits(("aZ-_".repeat(10) + "xY").as_bytes()).0, 252.0, "base64url, 42 characters");
        assert_eq!(bits(b"Tr0ub4dor&3").1, "printable ASCII characters");
        assert!((bits(&[b'!'; 39]).0 - 39.0 * 95f64.log2()).abs() < 1e-9);
        assert_eq!(bits("é".repeat(31).as_bytes()), (248.0, "characters"));
        // `=` inside is no padding: printable ASCII.
        assert_eq!(bits(b"ab=cd").1, "printable ASCII characters");
        assert_eq!(bits(b"  \n").0, 0.0);
    }

    #[test]
    fn a_text_secret_is_trimmed_and_a_binary_one_is_taken_whole() {
        let (key, strength) = Strength::of(b" \tdeadbeef\n");
        assert_eq!((key.as_slice(), strength.count), (b"deadbeef".as_slice(), 8));
        let binary = [&[0xff, b' '][..], &[7u8; 30], b"\n"].concat();
        let (key, strength) = Strength::of(&binary);
        assert_eq!((key, strength.bits(), strength.alphabet), (binary.clone(), 264.0, "bytes"));
    }

    fn secret_file(body: &[u8], mode: u32) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cluster.secret");
        std::fs::write(&path, body).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        (dir, path)
    }

    #[test]
    fn each_refusal_names_the_file_and_the_fix() {
        let good = format!("{}\n", "0f".repeat(32));
        let (_d, path) = secret_file(good.as_bytes(), 0o600);
        assert!(read_secret(&path).is_ok());
        let cases: [(&[u8], u32, &[&str]); 5] = [
            (good.as_bytes(), 0o640, &["readable by other users (mode 0640)", "chmod 600"]),
            (good.as_bytes(), 0o602, &["writable by other users (mode 0602)", "chmod 600"]),
            (good.as_bytes(), 0o666, &["readable and writable by other users"]),
            (
                b"0123456789abcdef0123456789abcdef\n",
                0o600,
                &["about 128 bits", "32 hex digits", "head -c 32"],
            ),
            (b"correct horse battery staple", 0o600, &["about 183 bits", "printable ASCII"]),
        ];
        for (body, mode, parts) in cases {
            let (_d, path) = secret_file(body, mode);
            let p = path.display().to_string();
            let err = read_secret(&path).expect_err("refused").to_string();
            for part in parts.iter().chain(&[p.as_str()]) {
                assert!(err.contains(part), "{part:?} missing from: {err}");
            }
        }
        assert!(matches!(read_secret(&path.with_extension("absent")), Err(SecretFileError::Unreadable(_))));
        assert!(matches!(read_secret(path.parent().unwrap()), Err(SecretFileError::NotAFile)));
    }

    #[test]
    fn a_secret_file_of_another_uid_is_refused() {
        assert!(nix::unistd::geteuid().is_root(), "this test chowns a file: run it as root (CI does)");
        let (_d, path) = secret_file(format!("{}\n", "0f".repeat(32)).as_bytes(), 0o600);
        nix::unistd::chown(&path, Some(nix::unistd::Uid::from_raw(65534)), None).unwrap();
        let err = read_secret(&path).expect_err("refused").to_string();
        assert!(err.contains("belongs to uid 65534") && err.contains("chown 0"), "{err}");
    }
}
