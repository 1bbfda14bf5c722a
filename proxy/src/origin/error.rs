//! Origin failures, classified the way callers act on them.

use memarts_protocol::{ErrorCode, WireError};

use super::credentials::CredentialsError;

#[derive(Debug, thiserror::Error)]
pub enum OriginError {
    #[error("not found at the origin: {0}")]
    NotFound(String),
    /// The object no longer has the ETag the read started with (HTTP 412 on `If-Match`).
    #[error("object changed at the origin since the read started: {0}")]
    Stale(String),
    #[error("the origin refused access: {0}")]
    PermissionDenied(String),
    /// Malformed URL or key; never retried.
    #[error("bad request: {0}")]
    BadRequest(String),
    /// The origin answered with the wrong bytes (short body, wrong range); retried, never cached.
    #[error("the origin returned a malformed response: {0}")]
    Malformed(String),
    /// 5xx, reset, timeout and the like.
    #[error("origin request failed: {0}")]
    Failed(String),
    /// No valid credential to sign with (the credentials file is unreadable, invalid or expired);
    /// not retried: the file is looked at again by the next request.
    #[error("no valid S3 credentials: {0}")]
    Credentials(String),
}

impl From<CredentialsError> for OriginError {
    fn from(e: CredentialsError) -> OriginError {
        OriginError::Credentials(e.to_string())
    }
}

impl OriginError {
    /// Whether another attempt may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, OriginError::Failed(_) | OriginError::Malformed(_))
    }

    pub(crate) fn from_store(e: object_store::Error) -> OriginError {
        use object_store::Error as E;
        match e {
            E::NotFound { path, .. } => OriginError::NotFound(path),
            E::Precondition { path, .. } => OriginError::Stale(path),
            E::PermissionDenied { path, .. } | E::Unauthenticated { path, .. } => {
                OriginError::PermissionDenied(path)
            }
            E::InvalidPath { source } => OriginError::BadRequest(source.to_string()),
            E::NotSupported { source } => OriginError::BadRequest(source.to_string()),
            E::Generic { store, source } => match source.downcast::<CredentialsError>() {
                Ok(e) => OriginError::from(*e),
                Err(source) => OriginError::Failed(E::Generic { store, source }.to_string()),
            },
            other => OriginError::Failed(other.to_string()),
        }
    }
}

impl From<OriginError> for WireError {
    fn from(e: OriginError) -> WireError {
        let code = match &e {
            OriginError::NotFound(_) => ErrorCode::NotFound,
            OriginError::Stale(_) => ErrorCode::Stale,
            OriginError::PermissionDenied(_) | OriginError::Credentials(_) => ErrorCode::PermissionDenied,
            OriginError::BadRequest(_) => ErrorCode::BadRequest,
            OriginError::Malformed(_) | OriginError::Failed(_) => ErrorCode::OriginError,
        };
        WireError::new(code, e.to_string())
    }
}
