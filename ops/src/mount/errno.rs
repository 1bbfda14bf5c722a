//! What a failed fleet call becomes for the process that made the system call: the errno closest to
//! the shim's typed error. Every failure is also logged with its cause, since an errno says little.

use fuser::Errno;
use memarts_shim::Error;

pub fn errno_of(e: &Error) -> Errno {
    match e {
        Error::NotFound(_) => Errno::ENOENT,
        // The object changed at the origin after the open pinned its version: never mixed bytes.
        Error::Stale(_) => Errno::from_i32(libc::ESTALE),
        Error::PermissionDenied(_) | Error::Untrusted(_) => Errno::EACCES,
        Error::NoSpace(_) => Errno::ENOSPC,
        Error::BadRequest(_) => Errno::EINVAL,
        Error::Io(io) => io.raw_os_error().map_or(Errno::EIO, Errno::from_i32),
        _ => Errno::EIO,
    }
}

/// Logs `what` failing with `e` (to the mount's log) and returns its errno.
pub fn failed(what: &str, e: &Error) -> Errno {
    let errno = errno_of(e);
    if !matches!(e, Error::NotFound(_)) {
        eprintln!("memarts mount: {what}: {e}");
    }
    errno
}
