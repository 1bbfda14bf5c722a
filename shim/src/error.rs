//! The shim's typed errors: one variant per wire error code, plus the local failures.

use memarts_protocol::{ErrorCode, FrameError, WireError};

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    // The proxy's messages of these three say what happened and to what ("s3://b/k: not found at
    // the origin"): they are shown as they are, so that a message says a thing once.
    #[error("{0}")]
    NotFound(String),
    /// The object changed at the origin while it was being read; read it again.
    #[error("{0}")]
    Stale(String),
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    #[error("{0}")]
    Origin(String),
    #[error("corrupt data: {0}")]
    Corrupt(String),
    #[error("no space in the cache: {0}")]
    NoSpace(String),
    #[error("bad request: {0}")]
    BadRequest(String),
    /// The fleet (or the slot owning the data) did not answer before the deadline.
    #[error("memarts proxy unavailable: {0}")]
    Unavailable(String),
    #[error("internal proxy error: {0}")]
    Internal(String),
    /// The proxy answered something this shim cannot understand.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The fleet in the run dir is not one this client trusts (another user's run dir or proxy, or
    /// a run dir others can write to); nothing was read from it or sent to it. See `trust`.
    #[error("untrusted memarts fleet: {0}")]
    Untrusted(String),
    /// An environment variable is malformed (the error names it).
    #[error("configuration error: {0}")]
    Config(#[from] memarts_settings::SettingsError),
    /// A local I/O failure (reading a passed descriptor, a local file).
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
}

impl Error {
    /// Whether a proxy refused the request as one it cannot decode: it is of an older build.
    pub fn is_unknown_request(&self) -> bool {
        matches!(self, Error::BadRequest(why) if why.contains("malformed message"))
    }

    /// The wire code this error corresponds to, if it came from a proxy.
    pub fn code(&self) -> Option<ErrorCode> {
        Some(match self {
            Error::NotFound(_) => ErrorCode::NotFound,
            Error::Stale(_) => ErrorCode::Stale,
            Error::PermissionDenied(_) => ErrorCode::PermissionDenied,
            Error::Origin(_) => ErrorCode::OriginError,
            Error::Corrupt(_) => ErrorCode::Corrupt,
            Error::NoSpace(_) => ErrorCode::NoSpace,
            Error::BadRequest(_) => ErrorCode::BadRequest,
            Error::Unavailable(_) => ErrorCode::Unavailable,
            Error::Internal(_) => ErrorCode::Internal,
            _ => return None,
        })
    }
}

impl From<WireError> for Error {
    fn from(e: WireError) -> Error {
        let m = e.message;
        match e.code {
            ErrorCode::NotFound => Error::NotFound(m),
            ErrorCode::Stale => Error::Stale(m),
            ErrorCode::PermissionDenied => Error::PermissionDenied(m),
            ErrorCode::OriginError => Error::Origin(m),
            ErrorCode::Corrupt => Error::Corrupt(m),
            ErrorCode::NoSpace => Error::NoSpace(m),
            ErrorCode::BadRequest => Error::BadRequest(m),
            ErrorCode::Unavailable => Error::Unavailable(m),
            _ => Error::Internal(m),
        }
    }
}

impl From<FrameError> for Error {
    fn from(e: FrameError) -> Error {
        match e {
            FrameError::Io(io) => Error::Io(io),
            other => Error::Protocol(other.to_string()),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
