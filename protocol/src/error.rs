//! Typed errors: the code carried on the wire, and the framing error of both readers.

use serde::{Deserialize, Serialize};

/// What went wrong, as the caller needs to know it. Append-only: the index is the wire tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum ErrorCode {
    /// The object (or prefix) does not exist at the origin, or the memarts-only object is absent.
    NotFound,
    /// The object changed at the origin since the read started (HTTP 412 on `If-Match`).
    Stale,
    /// The origin refused the credentials (403), or the peer's uid is not allowed.
    PermissionDenied,
    /// The origin failed after every retry (5xx, resets, timeouts), or answered something malformed.
    OriginError,
    /// Cached data failed its checksum and no origin copy exists to replace it.
    Corrupt,
    /// The cache cannot store the data (disk or quota full).
    NoSpace,
    /// The request is malformed or out of bounds (bad URL, chunk size, range).
    BadRequest,
    /// The proxy is shutting down or overloaded; retry elsewhere or later.
    Unavailable,
    /// A bug or an unexpected local failure in the proxy.
    Internal,
}

impl ErrorCode {
    /// Whether repeating the same request later can succeed without any change by the caller.
    pub fn is_retryable(self) -> bool {
        matches!(self, ErrorCode::Unavailable | ErrorCode::OriginError)
    }
}

/// An error as it travels on the wire: a code, a human message, and whether a retry makes sense.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{code:?}: {message}")]
pub struct WireError {
    pub code: ErrorCode,
    pub message: String,
    pub retryable: bool,
}

impl WireError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        WireError { code, message: message.into(), retryable: code.is_retryable() }
    }
}

/// Why a frame could not be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// The peer closed the connection cleanly between frames.
    #[error("connection closed by peer")]
    Closed,
    /// The head announces more bytes than the receiver accepts; nothing was allocated.
    #[error("{what} of {len} bytes exceeds the limit of {max} bytes")]
    TooLarge { what: &'static str, len: u64, max: u64 },
    /// The message bytes are not a valid message of this protocol version.
    #[error("malformed message: {0}")]
    Decode(#[from] postcard::Error),
    /// The socket failed, or closed in the middle of a frame.
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    /// A checked frame (the peer protocol's) whose head and message do not match their CRC32C: it was
    /// damaged on the way.
    #[error("frame damaged in transit: CRC32C {got:08x}, announced {want:08x}")]
    Damaged { got: u32, want: u32 },
}
