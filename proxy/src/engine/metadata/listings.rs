//! What a client's listing shows is kept (issue 29): datasets built `from_prefix`, `warmup`, `ls`,
//! `copy_parallel`, fsspec's `ls` and `find` list the objects they then read, and each page of
//! such a listing carries the version (ETag, size, time) of up to 1,000 objects. The slot that
//! answered the page hands what it showed of each directory to the slot that owns the directory
//! (`Request::Listed`), which keeps it as a listing of its own (`dir_versions.rs`): the reads that
//! follow, and the revalidations of the TTL after, make no origin request for those objects.
//!
//! A page covers the keys of its prefix in `(start_after, last]`: for a directory all of whose
//! keys have the prefix, every object of it in that range is in the page. A directory the
//! prefix only cuts into (`s3://b/train/a` lists `train/a*`, not all of `train/`) is not kept.
//! In a cluster, only a directory this node lists for the pool is kept (its node lists it
//! otherwise, for every node).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use memarts_protocol::{
    meta_owner_slot, ErrorCode, ListPage, ListRequest, ListedRange, ObjectMeta, ObjectUrl, OriginKind,
    Request, Response, WireError, MAX_LISTED,
};

use super::revalidate::{dir_of, in_dir};
use super::{parse_url, Metadata};

/// Encoded bytes of ranges sent in one `Listed`, about: well within a request's 64 KiB.
const LISTED_BYTES: usize = 32 << 10;

impl Metadata {
    /// One page of a client's listing; what it shows of whole directories is kept by their owners.
    pub async fn list(self: &Arc<Self>, req: &ListRequest) -> Result<ListPage, WireError> {
        let asked = Instant::now();
        let page = self.origin.list(req).await?;
        if let Ok(prefix) = parse_url(&req.url) {
            if prefix.kind == OriginKind::S3 && !self.info.passthrough {
                let after = req.start_after.as_deref().and_then(|a| key_in(&prefix.bucket, a));
                let ranges = listed_ranges(&prefix, after, &page, asked.elapsed());
                self.hand_to_owners(ranges).await;
            }
        }
        Ok(page)
    }

    /// Each range to the slot that owns its directory (this one, or another through its socket),
    /// unless another node lists that directory for the pool.
    async fn hand_to_owners(self: &Arc<Self>, ranges: Vec<ListedRange>) {
        let mut by_slot: BTreeMap<u32, Vec<ListedRange>> = BTreeMap::new();
        for range in ranges {
            let Ok(url) = ObjectUrl::parse(&format!("{}/x", range.dir)) else { continue };
            if self.owner_node(&dir_of(&url)).is_some() {
                continue;
            }
            by_slot.entry(meta_owner_slot(&range.dir, self.info.slots)).or_default().push(range);
        }
        for (slot, ranges) in by_slot {
            if slot == self.info.slot {
                self.keep_listed(ranges);
                continue;
            }
            let Some(siblings) = self.siblings.get() else { return };
            for batch in batches(ranges) {
                match siblings.call(slot, &Request::Listed(batch)).await {
                    Ok(Response::Recorded) => {}
                    // The directory is then listed when its objects' versions are asked for.
                    other => tracing::debug!("slot {slot} did not keep a listing's page: {other:?}"),
                }
            }
        }
    }

    /// `Request::Listed` from another slot: ranges of directories this slot owns, each checked
    /// (a directory's URL, entries of that directory within the range).
    pub fn serve_listed(&self, ranges: Vec<ListedRange>) -> Result<(), WireError> {
        let bad = |why: String| Err(WireError::new(ErrorCode::BadRequest, why));
        if ranges.iter().map(|r| r.entries.len()).sum::<usize>() > MAX_LISTED {
            return bad(format!("more than {MAX_LISTED} entries in one Listed"));
        }
        for range in &ranges {
            let url = match ObjectUrl::parse(&format!("{}/x", range.dir)) {
                Ok(url) if url.kind == OriginKind::S3 && dir_of(&url).url == range.dir => url,
                _ => return bad(format!("{:?} is not a directory of an object store", range.dir)),
            };
            if meta_owner_slot(&range.dir, self.info.slots) != self.info.slot {
                return bad(format!("{} is not a directory this slot lists", range.dir));
            }
            let dir = dir_of(&url).key;
            let within = |k: &str| {
                in_dir(&dir, k)
                    && range.after.as_deref().is_none_or(|a| a < k)
                    && range.last.as_deref().is_none_or(|l| k <= l)
            };
            if let Some((key, _)) = range.entries.iter().find(|(k, _)| !within(k)) {
                return bad(format!("{key:?} is not in the range listed of {}", range.dir));
            }
        }
        if !self.info.passthrough {
            self.keep_listed(ranges);
        }
        Ok(())
    }

    fn keep_listed(&self, ranges: Vec<ListedRange>) {
        for r in ranges {
            let Some(at) = Instant::now().checked_sub(Duration::from_millis(r.listed_ms_ago)) else {
                continue;
            };
            self.dir_versions.record(&r.dir, r.after, r.last, r.more, at, r.entries);
        }
    }
}

/// The key of `url` if it is an object URL of `bucket`.
fn key_in(bucket: &str, url: &str) -> Option<String> {
    let parsed = ObjectUrl::parse(url).ok()?;
    (parsed.kind == OriginKind::S3 && parsed.bucket == bucket).then_some(parsed.key)
}

/// Whether every key of directory `dir` (`""`: the bucket's top) starts with `prefix`.
fn whole_dir(prefix: &str, dir: &str) -> bool {
    prefix.is_empty() || (!dir.is_empty() && format!("{dir}/").starts_with(prefix))
}

/// What `page` (of a listing of `prefix` from after key `after`, asked for `ago`) shows of each
/// directory it holds whole, in pieces of about [`LISTED_BYTES`].
fn listed_ranges(
    prefix: &ObjectUrl,
    after: Option<String>,
    page: &ListPage,
    ago: Duration,
) -> Vec<ListedRange> {
    let keys: Vec<(String, &memarts_protocol::ListEntry)> =
        page.entries.iter().filter_map(|e| Some((key_in(&prefix.bucket, &e.url)?, e))).collect();
    let last = keys.last().map(|(k, _)| k.clone());
    let mut dirs: BTreeMap<String, Vec<(String, ObjectMeta)>> = BTreeMap::new();
    for (key, e) in keys.iter().filter(|(_, e)| !e.is_dir) {
        let dir = key.rsplit_once('/').map_or("", |(d, _)| d);
        if whole_dir(&prefix.key, dir) {
            let meta = ObjectMeta {
                size: e.size,
                etag: e.etag.clone(),
                version: None,
                last_modified_ms: e.last_modified_ms,
            };
            dirs.entry(dir.to_string()).or_default().push((key.clone(), meta));
        }
    }
    let mut ranges = Vec::new();
    for (dir, entries) in dirs {
        let starts = format!("{dir}/");
        let top = dir.is_empty();
        // Past the directory's keys, the page says nothing more of it: complete to its end.
        let more = page.next.is_some() && last.as_deref().is_some_and(|l| top || l.starts_with(&starts));
        let dir_url =
            if top { format!("s3://{}", prefix.bucket) } else { format!("s3://{}/{dir}", prefix.bucket) };
        // Before the directory's keys, `after` says nothing either.
        let mut from = after.clone().filter(|a| top || a.as_str() >= starts.as_str());
        let mut piece: Vec<(String, ObjectMeta)> = Vec::new();
        let mut bytes = 0;
        let count = entries.len();
        for (i, (key, meta)) in entries.into_iter().enumerate() {
            bytes += entry_bytes(&key, &meta);
            piece.push((key, meta));
            if bytes >= LISTED_BYTES && i + 1 < count {
                let cut = piece.last().map(|(k, _)| k.clone());
                ranges.push(ListedRange {
                    dir: dir_url.clone(),
                    after: from.replace(cut.clone().unwrap_or_default()),
                    last: cut,
                    more: true,
                    listed_ms_ago: ago.as_millis() as u64,
                    entries: std::mem::take(&mut piece),
                });
                bytes = 0;
            }
        }
        ranges.push(ListedRange {
            dir: dir_url,
            after: from,
            last: if more { last.clone() } else { None },
            more,
            listed_ms_ago: ago.as_millis() as u64,
            entries: piece,
        });
    }
    ranges
}

fn entry_bytes(key: &str, meta: &ObjectMeta) -> usize {
    key.len() + meta.etag.as_ref().map_or(0, String::len) + 24
}

/// `ranges` packed into messages of about [`LISTED_BYTES`] each.
fn batches(ranges: Vec<ListedRange>) -> Vec<Vec<ListedRange>> {
    batched(ranges, LISTED_BYTES, |range| {
        64 + range.dir.len()
            + range.after.as_ref().map_or(0, String::len)
            + range.last.as_ref().map_or(0, String::len)
            + range.entries.iter().map(|(k, m)| entry_bytes(k, m)).sum::<usize>()
    })
}

/// `items` in order, in batches of about `limit` bytes as `size` counts them (an item larger than
/// that alone): what one message between slots carries.
pub(super) fn batched<T>(items: Vec<T>, limit: usize, size: impl Fn(&T) -> usize) -> Vec<Vec<T>> {
    let mut out: Vec<Vec<T>> = Vec::new();
    let mut bytes = 0;
    for item in items {
        let n = size(&item);
        match out.last_mut() {
            Some(batch) if bytes + n <= limit => batch.push(item),
            _ => {
                out.push(vec![item]);
                bytes = 0;
            }
        }
        bytes += n;
    }
    out
}

#[cfg(test)]
#[path = "listings_tests.rs"]
mod tests;
