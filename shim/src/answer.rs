//! Taking the expected answer out of a proxy's response: every request has one variant it expects;
//! a typed `Error` answer becomes the matching [`crate::Error`], and anything else is a protocol
//! error that names the request.

/// `expect_answer!(response, "Stat", Response::Stat(meta) => meta)` is `Ok(meta)` for the expected
/// variant, the proxy's error for `Response::Error`, and `Error::Protocol("unexpected answer to
/// Stat: …")` for any other answer.
///
/// A macro rather than a function: the expected variant is a pattern, and a function would need a
/// closure at every call site that handed the unmatched response back, which is most of what the
/// match it replaces was.
macro_rules! expect_answer {
    ($response:expr, $request:literal, $expected:pat => $value:expr) => {
        match $response {
            $expected => Ok($value),
            memarts_protocol::Response::Error(e) => Err($crate::error::Error::from(e)),
            other => Err($crate::error::Error::Protocol(format!(
                concat!("unexpected answer to ", $request, ": {:?}"),
                other
            ))),
        }
    };
}

pub(crate) use expect_answer;
