//! Object URLs, parsed the same way by the shim (to route) and the proxy (to fetch).
//!
//! `s3://`, `obs://` and `oss://` all name a bucket on the one configured S3-compatible endpoint, so
//! they normalise to the same [`ObjectUrl`] (and the same cached chunks). `file:///abs` and absolute
//! plain paths name the local file system. Relative paths are made absolute by the shim, in the
//! worker's working directory, before they go on the wire.

use std::fmt;

/// Which kind of origin holds an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OriginKind {
    S3,
    Local,
}

impl OriginKind {
    pub fn as_str(self) -> &'static str {
        match self {
            OriginKind::S3 => "s3",
            OriginKind::Local => "file",
        }
    }
}

/// A parsed object location. For `Local`, `bucket` is empty and `key` is the absolute path.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ObjectUrl {
    pub kind: OriginKind,
    pub bucket: String,
    pub key: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    #[error("empty URL")]
    Empty,
    #[error("URL of {0} bytes is longer than the limit of {max} bytes", max = crate::MAX_URL_LEN)]
    TooLong(usize),
    #[error("URL contains a NUL byte")]
    Nul,
    #[error("unsupported URL scheme {0:?} (use s3://, obs://, oss://, file:// or a local path)")]
    Scheme(String),
    #[error("URL {0:?} names no bucket")]
    NoBucket(String),
    #[error("local path {0:?} is not absolute")]
    Relative(String),
}

impl ObjectUrl {
    pub fn parse(url: &str) -> Result<ObjectUrl, UrlError> {
        if url.is_empty() {
            return Err(UrlError::Empty);
        }
        if url.len() > crate::MAX_URL_LEN {
            return Err(UrlError::TooLong(url.len()));
        }
        if url.contains('\0') {
            return Err(UrlError::Nul);
        }
        // An absolute path is local whatever it contains: `/data/a:///b` has no scheme, and it is
        // what a `file:///data/a:///b` URL displays as, which must parse back to the same path.
        if url.starts_with('/') {
            return Self::local(url);
        }
        if let Some((scheme, rest)) = url.split_once("://") {
            match scheme.to_ascii_lowercase().as_str() {
                "s3" | "obs" | "oss" | "s3a" => {
                    let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
                    if bucket.is_empty() {
                        return Err(UrlError::NoBucket(url.to_string()));
                    }
                    Ok(ObjectUrl { kind: OriginKind::S3, bucket: bucket.to_string(), key: key.to_string() })
                }
                "file" => Self::local(rest),
                other => Err(UrlError::Scheme(other.to_string())),
            }
        } else {
            Self::local(url)
        }
    }

    fn local(path: &str) -> Result<ObjectUrl, UrlError> {
        if !path.starts_with('/') {
            return Err(UrlError::Relative(path.to_string()));
        }
        Ok(ObjectUrl { kind: OriginKind::Local, bucket: String::new(), key: path.to_string() })
    }

    /// The same location with `child` appended below it as a directory entry.
    pub fn join(&self, child: &str) -> ObjectUrl {
        let mut key = self.key.clone();
        if !key.is_empty() && !key.ends_with('/') {
            key.push('/');
        }
        key.push_str(child);
        ObjectUrl { kind: self.kind, bucket: self.bucket.clone(), key }
    }
}

impl fmt::Display for ObjectUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            OriginKind::S3 => write!(f, "s3://{}/{}", self.bucket, self.key),
            OriginKind::Local => f.write_str(&self.key),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cloud_schemes_name_the_same_bucket() {
        let a = ObjectUrl::parse("obs://bkt/dir/a.jpg").unwrap();
        let b = ObjectUrl::parse("s3://bkt/dir/a.jpg").unwrap();
        let c = ObjectUrl::parse("OSS://bkt/dir/a.jpg").unwrap();
        assert_eq!(a, b);
        assert_eq!(b, c);
        assert_eq!(a.to_string(), "s3://bkt/dir/a.jpg");
        assert_eq!(ObjectUrl::parse("s3://bkt").unwrap().key, "");
    }

    #[test]
    fn local_paths_and_errors() {
        assert_eq!(ObjectUrl::parse("file:///tmp/x").unwrap().key, "/tmp/x");
        assert_eq!(ObjectUrl::parse("/tmp/x").unwrap().kind, OriginKind::Local);
        assert_eq!(ObjectUrl::parse("tmp/x"), Err(UrlError::Relative("tmp/x".into())));
        assert!(matches!(ObjectUrl::parse("http://x/y"), Err(UrlError::Scheme(_))));
        assert!(matches!(ObjectUrl::parse("s3:///k"), Err(UrlError::NoBucket(_))));
        assert_eq!(ObjectUrl::parse("/a\0b"), Err(UrlError::Nul));
        assert!(matches!(ObjectUrl::parse(&"/a".repeat(10_000)), Err(UrlError::TooLong(_))));
    }

    /// Found by the `message` fuzz target: a local path holding `://` was refused as a bad scheme,
    /// so `file:///te:///d` parsed but its display form `/te:///d` did not.
    #[test]
    fn absolute_paths_with_a_scheme_separator_are_local() {
        let url = ObjectUrl::parse("file:///te:///d").unwrap();
        assert_eq!(url, ObjectUrl { kind: OriginKind::Local, bucket: String::new(), key: "/te:///d".into() });
        assert_eq!(ObjectUrl::parse(&url.to_string()), Ok(url));
        assert_eq!(ObjectUrl::parse("/data/s3://b/k").unwrap().key, "/data/s3://b/k");
    }
}
