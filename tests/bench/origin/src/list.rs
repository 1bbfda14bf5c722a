//! LIST without a delimiter, over the prefix's directory only, in one blocking step.
//!
//! s3s-fs answers every LIST page by walking the whole bucket through `tokio::fs` (a round trip
//! to tokio's blocking pool for each entry's metadata), sorting it all, then keeping one page: on
//! the benchmarks' bucket (1,500 small files and a large object) about 50 ms of server time on an
//! idle 2-core machine for every page, whatever its size (more while the machine is busy), which a
//! warmup waits for before its first GET. Here the walk starts at the directory the prefix names,
//! reads only names (the directory entries' types), and takes the metadata of the page's keys
//! alone. The answer is s3s-fs's: the same keys, sizes, modification times and continuation
//! tokens (the last key of a page). A LIST with a delimiter, or a prefix that is not a plain
//! relative path, goes to s3s-fs.

use std::io;
use std::path::{Component, Path};

use s3s::dto::*;
use s3s::{S3Request, S3Response, S3Result};

use crate::io_error;

/// The page, or `None` when s3s-fs must answer (a delimiter, an unusual prefix, no such bucket).
pub fn list_v2(
    root: &Path,
    req: &S3Request<ListObjectsV2Input>,
) -> Option<S3Result<S3Response<ListObjectsV2Output>>> {
    let input = &req.input;
    let prefix = input.prefix.as_deref().unwrap_or("").trim_start_matches('/');
    if input.delimiter.is_some() || !plain(&input.bucket) || !plain(prefix) {
        return None;
    }
    let bucket = root.join(&input.bucket);
    if !bucket.is_dir() {
        return None;
    }
    let max_keys = input.max_keys.unwrap_or(1000);
    let after = match (input.continuation_token.as_deref(), input.start_after.as_deref()) {
        (Some(ct), Some(sa)) => Some(ct.max(sa)),
        (ct, sa) => ct.or(sa),
    };
    Some(page(&bucket, prefix, after, max_keys).map_err(io_error).map(|(objects, is_truncated)| {
        let next_continuation_token =
            if is_truncated { objects.last().and_then(|o| o.key.clone()) } else { None };
        S3Response::new(ListObjectsV2Output {
            key_count: Some(objects.len() as i32),
            max_keys: Some(max_keys),
            is_truncated: Some(is_truncated),
            contents: (!objects.is_empty()).then_some(objects),
            continuation_token: input.continuation_token.clone(),
            next_continuation_token,
            encoding_type: input.encoding_type.clone(),
            name: Some(input.bucket.clone()),
            prefix: input.prefix.clone(),
            start_after: input.start_after.clone(),
            ..Default::default()
        })
    }))
}

/// Names and prefixes made only of plain path components (no `..`, no root).
fn plain(s: &str) -> bool {
    Path::new(s).components().all(|c| matches!(c, Component::Normal(_)))
}

/// The keys under `prefix` after `after`, sorted, at most `max_keys` of them with their metadata,
/// and whether more follow.
fn page(bucket: &Path, prefix: &str, after: Option<&str>, max_keys: i32) -> io::Result<(Vec<Object>, bool)> {
    // The deepest directory every key with this prefix lies under.
    let dir = match prefix.rfind('/') {
        Some(i) => bucket.join(&prefix[..i]),
        None => bucket.to_owned(),
    };
    let mut keys = Vec::new();
    let mut dirs = vec![dir];
    while let Some(dir) = dirs.pop() {
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            // No such directory, or a file where the prefix names one: no keys there.
            Err(e) if matches!(e.kind(), io::ErrorKind::NotFound | io::ErrorKind::NotADirectory) => continue,
            Err(e) => return Err(e),
        };
        for entry in entries {
            let entry = entry?;
            let path = entry.path();
            if entry.file_type()?.is_dir() {
                dirs.push(path);
            } else if let Some(key) = key_of(bucket, &path) {
                if key.starts_with(prefix) && after.is_none_or(|a| key.as_str() > a) {
                    keys.push(key);
                }
            }
        }
    }
    keys.sort_unstable();
    let take = usize::try_from(max_keys).unwrap_or(0);
    let is_truncated = take > 0 && keys.len() > take;
    keys.truncate(take);
    let objects = keys
        .into_iter()
        .map(|key| {
            let meta = std::fs::metadata(bucket.join(&key))?;
            Ok(Object {
                last_modified: Some(Timestamp::from(meta.modified()?)),
                size: Some(meta.len() as i64),
                key: Some(key),
                ..Default::default()
            })
        })
        .collect::<io::Result<_>>()?;
    Ok((objects, is_truncated))
}

/// The key of a file: its path under the bucket, components joined by `/` (as s3s-fs names it).
fn key_of(bucket: &Path, path: &Path) -> Option<String> {
    let rel = path.strip_prefix(bucket).ok()?;
    let parts: Option<Vec<&str>> = rel.components().map(|c| c.as_os_str().to_str()).collect();
    Some(parts?.join("/"))
}
