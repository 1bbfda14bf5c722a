//! Adaptive busy-polling of a socket, used by both ends of a connection.
//!
//! Waking a thread blocked on a Unix socket costs a cross-CPU interrupt; on virtual machines that is
//! tens of microseconds per direction (measured 75 µs for a blocking ping-pong on a 2-core VM, 3.5 µs
//! when both sides poll). For a warm read that is most of the cost, so each side polls the socket for a
//! short budget before it blocks. A poll that runs out of budget backs off: the next `2^n - 1` waits
//! block at once, `n` growing with each consecutive miss (up to [`MAX_BACKOFF_EXP`]), so a peer that is
//! slow to answer costs at most one budget every 64 waits.

use std::os::fd::RawFd;
use std::time::{Duration, Instant};

/// The default budget, overridden by `MEMARTS_SPIN_US` (0 turns polling off).
pub const DEFAULT_SPIN: Duration = Duration::from_micros(100);
/// Backoff after consecutive misses caps at `2^6 - 1 = 63` blocking waits between polls.
pub const MAX_BACKOFF_EXP: u32 = 6;

/// A `MEMARTS_SPIN_US` value that is not a number of microseconds between 0 and 10000. Its message
/// names the variable, so the shim and the proxy's config report it as it is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("MEMARTS_SPIN_US={value:?} is not a number of microseconds between 0 and 10000")]
pub struct SpinUsError {
    /// The value as it was given, untrimmed.
    pub value: String,
}

/// Parses a `MEMARTS_SPIN_US` value: microseconds, 0 to 10000 (0 turns polling off).
pub fn parse_spin_us(value: &str) -> Result<Duration, SpinUsError> {
    match value.trim().parse::<u64>() {
        Ok(us) if us <= 10_000 => Ok(Duration::from_micros(us)),
        _ => Err(SpinUsError { value: value.to_string() }),
    }
}

/// Per-connection polling state.
#[derive(Debug, Clone)]
pub struct Spinner {
    budget: Duration,
    skip: u32,
    misses: u32,
}

impl Spinner {
    pub fn new(budget: Duration) -> Spinner {
        Spinner { budget, skip: 0, misses: 0 }
    }

    /// Polls `fd` until it has bytes to read (true), it reports EOF or an error (true: the caller's
    /// read will see it), or the budget runs out (false). Never consumes anything.
    pub fn wait_readable(&mut self, fd: RawFd) -> bool {
        if self.budget.is_zero() {
            return false;
        }
        if self.skip > 0 {
            self.skip -= 1;
            return false;
        }
        let start = Instant::now();
        loop {
            if readable_now(fd) {
                self.misses = 0;
                return true;
            }
            if start.elapsed() >= self.budget {
                self.misses = (self.misses + 1).min(MAX_BACKOFF_EXP);
                self.skip = (1 << self.misses) - 1;
                return false;
            }
            std::hint::spin_loop();
        }
    }
}

/// True when a read on `fd` would not block: data, EOF, or a pending error. Consumes nothing.
pub fn readable_now(fd: RawFd) -> bool {
    let mut byte = 0u8;
    // SAFETY: `byte` is a valid one-byte buffer for the duration of the call; MSG_PEEK leaves the
    // socket's contents untouched and MSG_DONTWAIT keeps the call from blocking. An invalid `fd`
    // only yields EBADF.
    let n = unsafe { libc::recv(fd, (&mut byte as *mut u8).cast(), 1, libc::MSG_PEEK | libc::MSG_DONTWAIT) };
    if n >= 0 {
        return true;
    }
    let err = std::io::Error::last_os_error().raw_os_error();
    !matches!(err, Some(libc::EAGAIN) | Some(libc::EINTR))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;

    #[test]
    fn sees_pending_bytes_without_consuming_them() {
        let (mut a, b) = UnixStream::pair().unwrap();
        a.write_all(b"x").unwrap();
        let mut s = Spinner::new(Duration::from_micros(10));
        assert!(s.wait_readable(b.as_raw_fd()));
        assert!(s.wait_readable(b.as_raw_fd()), "peeking must leave the byte in place");
    }

    #[test]
    fn eof_counts_as_ready() {
        let (a, b) = UnixStream::pair().unwrap();
        drop(a);
        assert!(Spinner::new(Duration::from_micros(10)).wait_readable(b.as_raw_fd()));
    }

    #[test]
    fn misses_back_off_exponentially_and_a_hit_resets() {
        let (mut a, b) = UnixStream::pair().unwrap();
        let mut s = Spinner::new(Duration::from_micros(5));
        let fd = b.as_raw_fd();
        assert!(!s.wait_readable(fd)); // miss 1: skip 1
        assert_eq!(s.skip, 1);
        assert!(!s.wait_readable(fd)); // skipped
        assert!(!s.wait_readable(fd)); // miss 2: skip 3
        assert_eq!(s.skip, 3);
        for _ in 0..3 {
            assert!(!s.wait_readable(fd));
        }
        a.write_all(b"x").unwrap();
        assert!(s.wait_readable(fd));
        assert_eq!((s.skip, s.misses), (0, 0));
        for _ in 0..20 {
            s.misses = (s.misses + 1).min(MAX_BACKOFF_EXP);
        }
        assert_eq!((1u32 << s.misses) - 1, 63);
    }

    #[test]
    fn parses_the_budget_and_names_the_variable_on_error() {
        assert_eq!(parse_spin_us(" 25 "), Ok(Duration::from_micros(25)));
        assert_eq!(parse_spin_us("0"), Ok(Duration::ZERO));
        for bad in ["-1", "fast", "10001", "1.5"] {
            let err = parse_spin_us(bad).unwrap_err();
            assert_eq!(err, SpinUsError { value: bad.to_string() });
            assert!(err.to_string().contains("MEMARTS_SPIN_US"), "{bad}");
        }
    }

    #[test]
    fn zero_budget_never_polls() {
        let (mut a, b) = UnixStream::pair().unwrap();
        a.write_all(b"x").unwrap();
        assert!(!Spinner::new(Duration::ZERO).wait_readable(b.as_raw_fd()));
    }
}
