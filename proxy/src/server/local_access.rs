//! Local origins for clients of other uids. A slot reads `file://` and plain-path origins with its
//! own rights. For clients of its own uid that grants nothing they could not do themselves, but a
//! client of another uid let in by `allowed_uids` would read (and through uploads and deletes,
//! change) whatever the proxy can. So such clients may only *read* local paths under the
//! configured `local_roots` (none by default), and never write or delete local paths through the
//! proxy: they write their own files themselves.
//!
//! The check runs before the request reaches the cache, so chunks and metadata of a file another
//! client read are not a way around it. A path is judged by where it really leads: the deepest part
//! of it that exists is resolved (symlinks and `..` included) and must lie under a resolved root;
//! what follows that part may not contain `..`. (A client able to swap a symlink under a root
//! between this check and the read could still race it; roots should not be writable by clients
//! the proxy does not trust with its own rights.)

use std::path::{Path, PathBuf};
use std::sync::Arc;

use memarts_protocol::{ErrorCode, ObjectUrl, OriginKind, Request, WireError};

/// What a request does with a local path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocalUse {
    /// Stat, list, read.
    Read,
    /// Upload, delete.
    Write,
}

/// The rule of one slot: its own uid, and the roots other uids may read.
#[derive(Debug, Clone)]
pub struct LocalAccess {
    own_uid: u32,
    roots: Arc<[PathBuf]>,
}

impl LocalAccess {
    pub fn new(own_uid: u32, roots: &[PathBuf]) -> LocalAccess {
        LocalAccess { own_uid, roots: roots.into() }
    }

    /// Whether `uid` is the proxy's own.
    pub fn is_own(&self, uid: u32) -> bool {
        uid == self.own_uid
    }

    /// Whether client `uid` may make `request`: every URL it names, as the request uses it.
    /// memarts-only objects are keys in the cache, not paths, so their requests always pass.
    pub async fn check_request(&self, uid: u32, request: &Request) -> Result<(), WireError> {
        if uid == self.own_uid {
            return Ok(());
        }
        let (read, write) = (LocalUse::Read, LocalUse::Write);
        let urls: Vec<(&str, LocalUse)> = match request {
            Request::Stat { url, .. } => vec![(url, read)],
            Request::ReadChunk(c) => vec![(&c.url, read)],
            Request::ReadFirst(f) => vec![(&f.url, read)],
            Request::List(l) => vec![(&l.url, read)],
            Request::ReadChunks(cs) => cs.iter().map(|c| (c.url.as_str(), read)).collect(),
            Request::Prefetch(p) => p.urls.iter().map(|u| (u.as_str(), read)).collect(),
            Request::Fill(f) => f.urls.iter().map(|u| (u.as_str(), read)).collect(),
            Request::PutStart { url } | Request::Delete { url } => vec![(url, write)],
            Request::Hello(_)
            | Request::Status
            | Request::PutData
            | Request::PutFinish { .. }
            | Request::PutMemartsStart { .. }
            | Request::ReadMemarts { .. }
            | Request::ClusterStatus
            | Request::PrefetchStatus
            | Request::AdmissionStatus
            | Request::Metrics
            | Request::Touched(_)
            | Request::Revalidate(_)
            | Request::Forget { .. }
            | Request::Listed(_)
            | Request::Confirm(_) => Vec::new(),
        };
        for (url, use_) in urls {
            self.check(uid, url, use_).await?;
        }
        Ok(())
    }

    /// Whether client `uid` may `use_` the object `url`. Anything that is not a local path passes
    /// (a malformed URL is refused later, by the handler, with its own error).
    pub async fn check(&self, uid: u32, url: &str, use_: LocalUse) -> Result<(), WireError> {
        if uid == self.own_uid {
            return Ok(());
        }
        let Ok(parsed) = ObjectUrl::parse(url) else { return Ok(()) };
        if parsed.kind != OriginKind::Local {
            return Ok(());
        }
        let denied = |why: String| Err(WireError::new(ErrorCode::PermissionDenied, why));
        if use_ == LocalUse::Write {
            return denied(format!(
                "uid {uid} may not write or delete local paths through this proxy (it runs as uid {}); \
                 write {} yourself",
                self.own_uid, parsed.key
            ));
        }
        let path = PathBuf::from(&parsed.key);
        let roots = self.roots.clone();
        let inside = tokio::task::spawn_blocking(move || under_a_root(&path, &roots)).await.unwrap_or(false);
        if inside {
            return Ok(());
        }
        let roots: Vec<String> = self.roots.iter().map(|r| r.display().to_string()).collect();
        denied(format!(
            "uid {uid} may read local paths through this proxy only under its local_roots ({}); {} is \
             not under one",
            if roots.is_empty() { "none are configured".to_string() } else { roots.join(", ") },
            parsed.key
        ))
    }
}

/// Whether `path`, resolved, lies under one of `roots`, resolved.
fn under_a_root(path: &Path, roots: &[PathBuf]) -> bool {
    let Some(resolved) = resolve(path) else { return false };
    roots.iter().filter_map(|r| std::fs::canonicalize(r).ok()).any(|root| resolved.starts_with(root))
}

/// The real location of `path`: its deepest existing ancestor canonicalized, then the names that
/// follow it. A path whose missing part holds `..` resolves to nothing (`file_name` stops there):
/// it cannot be resolved against the file system, so it is not trusted.
fn resolve(path: &Path) -> Option<PathBuf> {
    let mut existing = path;
    let mut rest = Vec::new();
    loop {
        if let Ok(mut real) = std::fs::canonicalize(existing) {
            real.extend(rest.iter().rev());
            return Some(real);
        }
        rest.push(existing.file_name()?);
        existing = existing.parent()?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OTHER: u32 = 4242;

    fn access(roots: &[&Path]) -> LocalAccess {
        let roots: Vec<PathBuf> = roots.iter().map(|r| r.to_path_buf()).collect();
        LocalAccess::new(1000, &roots)
    }

    async fn allowed(a: &LocalAccess, uid: u32, url: &str, use_: LocalUse) -> bool {
        match a.check(uid, url, use_).await {
            Ok(()) => true,
            Err(e) => {
                assert_eq!(e.code, ErrorCode::PermissionDenied, "{e:?}");
                false
            }
        }
    }

    #[tokio::test]
    async fn other_uids_read_under_the_roots_only_and_never_write() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("datasets");
        std::fs::create_dir_all(root.join("imagenet")).unwrap();
        std::fs::write(root.join("imagenet/a.jpg"), b"a").unwrap();
        std::fs::write(dir.path().join("secret"), b"s").unwrap();
        std::os::unix::fs::symlink(dir.path().join("secret"), root.join("link")).unwrap();
        let a = access(&[&root]);
        let p = |rel: &str| root.join(rel).display().to_string();

        assert!(allowed(&a, OTHER, &p("imagenet/a.jpg"), LocalUse::Read).await);
        assert!(allowed(&a, OTHER, &format!("file://{}", p("imagenet/")), LocalUse::Read).await);
        assert!(allowed(&a, OTHER, &p("imagenet/not-yet/b.jpg"), LocalUse::Read).await);
        assert!(!allowed(&a, OTHER, &dir.path().join("secret").display().to_string(), LocalUse::Read).await);
        assert!(!allowed(&a, OTHER, &p("../secret"), LocalUse::Read).await, "`..` out of the root");
        assert!(!allowed(&a, OTHER, &p("missing/../../secret"), LocalUse::Read).await);
        assert!(!allowed(&a, OTHER, &p("link"), LocalUse::Read).await, "a symlink out of the root");
        assert!(!allowed(&a, OTHER, &format!("{}-sibling/x", root.display()), LocalUse::Read).await);
        assert!(!allowed(&a, OTHER, &p("imagenet/a.jpg"), LocalUse::Write).await);
        // Object URLs and the proxy's own uid are not this rule's business.
        assert!(allowed(&a, OTHER, "s3://bucket/key", LocalUse::Write).await);
        assert!(allowed(&a, 1000, &dir.path().join("secret").display().to_string(), LocalUse::Write).await);
    }

    #[tokio::test]
    async fn without_roots_other_uids_read_no_local_path_and_the_error_says_so() {
        let a = access(&[]);
        let err = a.check(OTHER, "/etc/hostname", LocalUse::Read).await.unwrap_err();
        assert!(err.message.contains("local_roots") && err.message.contains("none"), "{err:?}");
        assert!(!err.retryable);
    }
}
