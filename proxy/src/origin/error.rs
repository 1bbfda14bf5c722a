//! Origin failures, classified the way callers act on them.

use memarts_protocol::{ErrorCode, WireError};

use super::credentials::CredentialsError;

#[derive(Debug, thiserror::Error)]
pub enum OriginError {
    /// The object (its URL, or its key when no URL is at hand) does not exist.
    #[error("{0}: not found at the origin")]
    NotFound(String),
    /// The bucket of the URL does not exist.
    #[error("{0}: no such bucket at the origin")]
    NoSuchBucket(String),
    /// The object no longer has the ETag the read started with (HTTP 412 on `If-Match`).
    #[error("{0}: changed at the origin since the read started")]
    Stale(String),
    #[error("{0}: the origin refused access")]
    PermissionDenied(String),
    /// No endpoint and no credentials are configured for an S3 URL; never retried.
    #[error("{0}")]
    NotConfigured(String),
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

    /// Whether the origin asked us to slow down (503 SlowDown, 429): the prefetcher then fetches
    /// fewer objects at once.
    pub fn is_throttle(&self) -> bool {
        match self {
            OriginError::Failed(m) => {
                m.contains("status code: 503") || m.contains("status code: 429") || m.contains("SlowDown")
            }
            _ => false,
        }
    }

    /// The error about `url`: the object or bucket it names, rather than the key object_store
    /// reports, so that the message says what the caller asked for.
    pub(crate) fn about(self, url: &impl std::fmt::Display) -> OriginError {
        match self {
            OriginError::NotFound(_) => OriginError::NotFound(url.to_string()),
            OriginError::Stale(_) => OriginError::Stale(url.to_string()),
            OriginError::PermissionDenied(_) => OriginError::PermissionDenied(url.to_string()),
            OriginError::NoSuchBucket(_) => OriginError::NoSuchBucket(url.to_string()),
            other => other,
        }
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
                Err(source) => {
                    let message = without_body(&E::Generic { store, source }.to_string());
                    // object_store reports a LIST of a missing bucket as a generic 404.
                    if message.contains("NoSuchBucket") {
                        OriginError::NoSuchBucket(String::new())
                    } else {
                        OriginError::Failed(message)
                    }
                }
            },
            other => OriginError::Failed(without_body(&other.to_string())),
        }
    }
}

/// An error message of object_store with the response body it ends with cut down to the S3 error's
/// `<Code>` and `<Message>`. S3 echoes credentials in some error bodies (S4): `ExpiredToken` and
/// `InvalidToken` carry the session token (`<Token-0>`), `SignatureDoesNotMatch` the canonical
/// request, `x-amz-security-token` header included; these messages go to clients and to logs.
fn without_body(message: &str) -> String {
    // object_store ends a message with `... non-2xx status code: 400 Bad Request: <body>` or
    // `... error response: <body>`.
    let body_at = match (message.find("non-2xx status code: "), message.find("error response: ")) {
        (Some(at), _) => message[at..].find(": ").and_then(|i| {
            let status = at + i + 2;
            message[status..].find(": ").map(|j| status + j + 2)
        }),
        (None, Some(at)) => Some(at + "error response: ".len()),
        (None, None) => None,
    };
    let Some(body_at) = body_at else { return message.to_string() };
    let body = &message[body_at..];
    let element = |name: &str| {
        let (_, rest) = body.split_once(&format!("<{name}>"))?;
        rest.split_once(&format!("</{name}>")).map(|(value, _)| value)
    };
    let summary = match (element("Code"), element("Message")) {
        (Some(code), Some(text)) => format!("{code}: {text}"),
        (Some(code), None) => code.to_string(),
        _ if body.trim().is_empty() => String::new(),
        _ => format!("(a body of {} bytes, not shown)", body.len()),
    };
    format!("{}{summary}", &message[..body_at])
}

impl From<OriginError> for WireError {
    fn from(e: OriginError) -> WireError {
        let code = match &e {
            OriginError::NotFound(_) | OriginError::NoSuchBucket(_) => ErrorCode::NotFound,
            OriginError::Stale(_) => ErrorCode::Stale,
            OriginError::PermissionDenied(_) | OriginError::Credentials(_) => ErrorCode::PermissionDenied,
            OriginError::BadRequest(_) => ErrorCode::BadRequest,
            OriginError::Malformed(_) | OriginError::Failed(_) | OriginError::NotConfigured(_) => {
                ErrorCode::OriginError
            }
        };
        WireError::new(code, e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::without_body;

    #[test]
    fn error_bodies_keep_their_code_and_message_and_nothing_they_echo() {
        let head = "Generic S3 error: Error performing GET http://h/b/k in 2ms - Server returned";
        let cases = [
            (
                format!(
                    "{head} non-2xx status code: 400 Bad Request: <Error><Code>ExpiredToken</Code>\
                     <Message>The provided token has expired.</Message><Token-0>TOKEN</Token-0></Error>"
                ),
                format!("{head} non-2xx status code: 400 Bad Request: ExpiredToken: The provided token has expired."),
            ),
            (
                format!("{head} error response: <Error><CanonicalRequest>x-amz-security-token:TOKEN</CanonicalRequest><Code>SignatureDoesNotMatch</Code></Error>"),
                format!("{head} error response: SignatureDoesNotMatch"),
            ),
            (
                format!("{head} non-2xx status code: 502 Bad Gateway: authorization: TOKEN"),
                format!("{head} non-2xx status code: 502 Bad Gateway: (a body of 20 bytes, not shown)"),
            ),
            (format!("{head} non-2xx status code: 503 Service Unavailable: "), format!("{head} non-2xx status code: 503 Service Unavailable: ")),
            ("connection reset by peer".to_string(), "connection reset by peer".to_string()),
        ];
        for (message, want) in cases {
            assert_eq!(without_body(&message), want);
            assert!(!without_body(&message).contains("TOKEN"));
        }
    }
}
