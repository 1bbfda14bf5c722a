//! Expired metadata revalidated by listing the object's directory, not by a HEAD per object (issue
//! 29): a warm epoch that starts after the metadata TTL asks the origin once per page of 1,000
//! keys, not once per object. The slot that owns a directory (`meta_owner_slot` of its URL) lists
//! it, one page at a time however many readers ask, and answers for every slot of the fleet
//! (`Request::Revalidate`); the versions it saw are trusted for the TTL from when the page was
//! asked for (`dir_versions.rs`), so an object replaced at the origin is seen within the TTL, as
//! with a HEAD. A first page starts at the directory's start (a directory of up to 1,000 objects
//! is then known whole); in a directory known to be larger, a page starts just before the key that
//! is wanted.
//!
//! A "page" here is one such listing (two requests of S3 at most, see [`FIRST_PAGE_KEYS`]).
//!
//! Anything a listing cannot settle goes to the origin with a HEAD, as before: a local path (a
//! `stat` costs less than a listing), an object the listing does not show (created since, or
//! gone), a directory whose listing fails (503s, resets: after the origin's own retries), an owner
//! slot that does not answer.

use std::sync::Arc;
use std::time::{Duration, Instant};

use memarts_protocol::{
    chunk_owner, meta_owner_slot, ConfirmedMeta, ListRequest, ObjectMeta, ObjectUrl, OriginKind, Request,
    Response, RevalidateRequest, Revalidated, WireError, MAX_REVALIDATED,
};

use super::dir_versions::{self, Asker, Seen};
use super::{parse_url, Metadata};

/// Keys of a directory's first listing: S3 answers 1,000 keys a request, and the next request is
/// made only to see past them, so a directory of up to 1,000 objects costs one request and one of
/// up to 1,999 two (the last key seen only says that more follow).
const FIRST_PAGE_KEYS: u32 = 1999;
/// Keys of a listing from just before a wanted key, in a directory known to be larger: one request.
const PAGE_KEYS: u32 = 999;

/// An object's directory: its URL (`s3://bucket/a/b`, or `s3://bucket` for the bucket's top) and
/// its key (`a/b`, or empty).
pub(super) struct Dir {
    pub url: String,
    pub key: String,
    pub bucket: String,
}

pub(super) fn dir_of(url: &ObjectUrl) -> Dir {
    let key = url.key.rsplit_once('/').map_or("", |(dir, _)| dir).to_string();
    let url_of =
        if key.is_empty() { format!("s3://{}", url.bucket) } else { format!("s3://{}/{key}", url.bucket) };
    Dir { url: url_of, key, bucket: url.bucket.clone() }
}

/// Where a directory is placed in a cluster: the node that lists it for the pool.
fn dir_placement(dir: &Dir) -> u64 {
    memarts_protocol::placement("s3", &dir.bucket, &format!("{}/", dir.key), 0, 0)
}

/// Whether `key` is an object of directory `dir` itself (not of one below it).
pub(super) fn in_dir(dir: &str, key: &str) -> bool {
    key.rsplit_once('/').map_or("", |(d, _)| d) == dir
}

/// A key just before `key` in byte order, below which a page may start to show `key` (a few keys
/// before it may come too): `key` without its last character, and without a `/` it would end with.
fn just_before(key: &str) -> Option<String> {
    let mut chars = key.chars();
    chars.next_back()?;
    let shorter = chars.as_str().trim_end_matches('/');
    (!shorter.is_empty()).then(|| shorter.to_string())
}

impl Metadata {
    /// The version of `url` the listing of its directory shows, and how long ago it was listed:
    /// from this slot if it owns the directory, else from the slot (or, in a cluster, the node)
    /// that does, whose answer also brings the versions of the directory's other objects this slot
    /// serves (read with chunks of `chunk_size`, if known), kept here for their reads to come.
    /// `None` when no listing can tell (see the module docs): the caller asks with a HEAD.
    pub(super) async fn revalidate_by_listing(
        self: &Arc<Self>,
        url: &ObjectUrl,
        chunk_size: Option<u64>,
    ) -> Option<(ObjectMeta, Duration)> {
        if url.kind != OriginKind::S3 || self.info.passthrough {
            return None;
        }
        let dir = dir_of(url);
        if !self.list_policy.may_list(&dir.bucket, &dir.url) {
            return None;
        }
        let req = RevalidateRequest {
            url: url.to_string(),
            chunk_size: chunk_size.unwrap_or(0),
            slot: self.info.slot,
            slots: self.info.slots,
        };
        let asked = Instant::now();
        let answer = match self.owner_node(&dir) {
            // In a cluster, the node that owns the directory lists it for the pool.
            Some(owner) => match self.cluster()?.peers.revalidate(&owner, &dir.url, &req).await {
                Ok(answer) => answer,
                Err(e) => {
                    tracing::debug!(node = owner.id, "revalidating {url} through its directory's node: {e}");
                    return None;
                }
            },
            None if meta_owner_slot(&dir.url, self.info.slots) == self.info.slot => {
                self.answer_revalidate(&req, url, &dir, true).await
            }
            None => {
                let owner = meta_owner_slot(&dir.url, self.info.slots);
                match self.siblings.get()?.call(owner, &Request::Revalidate(req)).await {
                    Ok(Response::Revalidated(answer)) => answer,
                    Ok(_) => return None,
                    Err(e) => {
                        tracing::debug!("revalidating {url} through its directory's slot: {e}");
                        return None;
                    }
                }
            }
        };
        // Confirmed that long before the question, at least.
        let ago =
            |c: &ConfirmedMeta| Duration::from_millis(c.confirmed_ms_ago).saturating_add(asked.elapsed());
        let held = answer.more.iter().filter(|(other, _)| self.holds(other, chunk_size)).count();
        self.list_policy.shown(&dir.url, answer.more.len(), held);
        for (other, c) in &answer.more {
            self.cache.put_confirmed(other.clone(), c.meta.clone(), ago(c));
        }
        answer.meta.map(|c| (c.meta.clone(), ago(&c)))
    }

    /// Whether this slot holds `url` (its chunk 0 read with chunks of `chunk_size`, or, with no
    /// chunk size, metadata of it, however old): what tells a listing worth its cost
    /// (`list_policy.rs`). Before the index is rebuilt, it cannot tell: held.
    fn holds(&self, url: &str, chunk_size: Option<u64>) -> bool {
        let Ok(parsed) = ObjectUrl::parse(url) else { return false };
        match chunk_size {
            Some(cs) if cs > 0 => {
                let placement =
                    memarts_protocol::placement(parsed.kind.as_str(), &parsed.bucket, &parsed.key, cs, 0);
                !self.chunks.index_ready() || self.chunks.has_placement(placement)
            }
            _ => self.cache.get_stale(url).is_some(),
        }
    }

    /// In a cluster, the node that owns `dir` if it is another one.
    pub(super) fn owner_node(&self, dir: &Dir) -> Option<crate::cluster::Member> {
        let cluster = self.cluster()?;
        cluster.owners(dir_placement(dir)).into_iter().next().filter(|o| o.id != cluster.me())
    }

    /// `Request::Revalidate` from another slot of this fleet: see `serve_revalidate_of`.
    pub async fn serve_revalidate(
        self: &Arc<Self>,
        req: &RevalidateRequest,
    ) -> Result<Revalidated, WireError> {
        self.serve_revalidate_of(req, true).await
    }

    /// `Request::Revalidate` from another slot (`local`) or `PeerRequest::Revalidate` from another
    /// node: this slot's answer as the owner of the directory (nothing if it is not: a request is
    /// never passed on). A slot of this fleet that asks is kept informed (`refresh.rs`).
    pub(crate) async fn serve_revalidate_of(
        self: &Arc<Self>,
        req: &RevalidateRequest,
        local: bool,
    ) -> Result<Revalidated, WireError> {
        let url = parse_url(&req.url)?;
        if url.kind != OriginKind::S3 || self.info.passthrough {
            return Ok(Revalidated::default());
        }
        let dir = dir_of(&url);
        if meta_owner_slot(&dir.url, self.info.slots) != self.info.slot {
            return Ok(Revalidated::default());
        }
        Ok(self.answer_revalidate(req, &url, &dir, local).await)
    }

    /// As the owner of `dir`: the version of `url` (listing the page that covers it if none does),
    /// and the other versions of the directory's fresh pages that the asking slot serves; a slot of
    /// this fleet (`local`) that asks is noted, for the directory to be kept fresh for it.
    async fn answer_revalidate(
        self: &Arc<Self>,
        req: &RevalidateRequest,
        url: &ObjectUrl,
        dir: &Dir,
        local: bool,
    ) -> Revalidated {
        let confirmed = |(meta, ago): (ObjectMeta, Duration)| ConfirmedMeta {
            meta,
            confirmed_ms_ago: ago.as_millis() as u64,
        };
        let meta = self.listed_version(url, dir).await.map(confirmed);
        if meta.is_none() {
            return Revalidated::default();
        }
        let asker = Asker { slot: req.slot, slots: req.slots, chunk_size: req.chunk_size };
        if local && req.slots == self.info.slots && req.slot < req.slots {
            self.dir_versions.note_asker(&dir.url, asker);
        }
        let mut more = self.versions_served(dir, asker);
        let asked = url.to_string();
        more.retain(|(other, _)| *other != asked);
        more.truncate(MAX_REVALIDATED);
        Revalidated { meta, more }
    }

    /// The versions of `dir`'s fresh pages that `asker` serves (at most [`MAX_REVALIDATED`]), each
    /// with its URL.
    pub(super) fn versions_served(&self, dir: &Dir, asker: Asker) -> Vec<(String, ConfirmedMeta)> {
        let serves = |key: &str| {
            let other = format!("s3://{}/{key}", dir.bucket);
            let owner = match asker.chunk_size {
                0 => meta_owner_slot(&other, asker.slots),
                cs => ObjectUrl::parse(&other).map_or(u32::MAX, |u| chunk_owner(&u, cs, 0, asker.slots)),
            };
            (owner == asker.slot).then_some(other)
        };
        self.dir_versions
            .fresh_entries(&dir.url)
            .into_iter()
            .filter_map(|(key, meta, ago)| {
                serves(&key)
                    .map(|other| (other, ConfirmedMeta { meta, confirmed_ms_ago: ago.as_millis() as u64 }))
            })
            .take(MAX_REVALIDATED + 1)
            .collect()
    }

    /// After `url` was written or deleted through this slot: the owner of its directory (this slot,
    /// or the one asked) forgets what listings showed of it, before the client is answered.
    pub(super) async fn forget_listed(self: &Arc<Self>, url: &ObjectUrl) {
        if url.kind != OriginKind::S3 || self.info.passthrough {
            return;
        }
        let dir = dir_of(url);
        if let Some(cluster) = self.cluster() {
            let owner = cluster.owners(dir_placement(&dir)).into_iter().next();
            if let Some(owner) = owner.filter(|o| o.id != cluster.me()) {
                if let Err(e) = cluster.peers.tell_changed(&owner, &dir.url, &url.to_string()).await {
                    tracing::warn!(node = owner.id, "it did not hear that {url} changed: {e}");
                }
            }
        }
        let owner = meta_owner_slot(&dir.url, self.info.slots);
        if owner == self.info.slot {
            return self.dir_versions.forget(&dir.url, &url.key);
        }
        let Some(siblings) = self.siblings.get() else { return };
        if let Err(e) = siblings.call(owner, &Request::Forget { url: url.to_string() }).await {
            // Its listings of the directory are then trusted until their TTL ends, as a reader's
            // metadata of an object written elsewhere is.
            tracing::warn!("slot {owner} did not hear that {url} changed: {e}");
        }
    }

    /// `Request::Forget` from another slot: forgets what this slot's listings showed of `url`.
    pub fn serve_forget(&self, url: &str) -> Result<(), WireError> {
        let url = parse_url(url)?;
        if url.kind == OriginKind::S3 {
            self.dir_versions.forget(&dir_of(&url).url, &url.key);
        }
        Ok(())
    }

    /// As the owner of `dir`: what its fresh pages say of `url`, after listing the page that
    /// covers it if none does.
    async fn listed_version(self: &Arc<Self>, url: &ObjectUrl, dir: &Dir) -> Option<(ObjectMeta, Duration)> {
        // A listing ends one page at a time: a reader waits for the one in flight, then asks for
        // the page that covers its own key if that one did not (a few times at most).
        for _ in 0..3 {
            match self.dir_versions.lookup(&dir.url, &url.key) {
                Seen::Listed(meta, ago) => return Some((meta, ago)),
                // Gone, or listed without an ETag (the origin's listings name no versions): the
                // asking slot asks for the object itself.
                Seen::Absent | Seen::Unversioned => return None,
                Seen::Unknown => {}
            }
            if !self.list_page_of(dir, &url.key).await {
                return None;
            }
        }
        None
    }

    /// Lists one page of `dir`, one at a time per directory: from its start, or, in a directory
    /// known to be larger than a page, from just before `key`. Whether the page came.
    pub(super) async fn list_page_of(self: &Arc<Self>, dir: &Dir, key: &str) -> bool {
        let flight = xxhash_rust::xxh3::xxh3_128(format!("list\0{}", dir.url).as_bytes());
        let (this, dir_url, dir_key, bucket) =
            (self.clone(), dir.url.clone(), dir.key.clone(), dir.bucket.clone());
        if !self.list_policy.may_list(&dir.bucket, &dir.url) {
            return false;
        }
        let after = self.dir_versions.is_large(&dir.url).then(|| just_before(key)).flatten();
        let listed = self
            .dir_flights
            .join_fallible(flight, "the listing of this directory", move |leader| async move {
                let at = Instant::now();
                let req = ListRequest {
                    url: dir_url.clone(),
                    recursive: true,
                    start_after: after.as_ref().map(|a| format!("s3://{bucket}/{a}")),
                    max_entries: if after.is_some() { PAGE_KEYS } else { FIRST_PAGE_KEYS },
                };
                let page = match this.origin.list(&req).await {
                    Ok(page) => page,
                    Err(e) => {
                        let e = WireError::from(e);
                        let refused = e.code == memarts_protocol::ErrorCode::PermissionDenied;
                        this.list_policy.failed(&bucket, &dir_url, refused);
                        tracing::warn!("listing {dir_url} failed, asking for each object instead: {e}");
                        leader.publish(Err(e));
                        return;
                    }
                };
                let prefix = format!("s3://{bucket}/");
                let key_of = |u: &str| u.strip_prefix(&prefix).unwrap_or(u).to_string();
                let last = page.entries.last().map(|e| key_of(&e.url));
                let entries = page
                    .entries
                    .iter()
                    .filter(|e| !e.is_dir && in_dir(&dir_key, &key_of(&e.url)))
                    .map(|e| {
                        let meta = ObjectMeta {
                            size: e.size,
                            etag: e.etag.clone(),
                            version: None,
                            last_modified_ms: e.last_modified_ms,
                        };
                        (key_of(&e.url), meta)
                    })
                    .collect::<Vec<_>>();
                if entries.iter().any(|(_, meta)| !dir_versions::versioned(meta)) {
                    this.list_policy.unversioned(&bucket);
                }
                this.counters.listed_pages.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                this.dir_versions.record(&dir_url, after, last, page.next.is_some(), at, entries);
                leader.publish(Ok(()));
            })
            .await;
        listed.is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directories_and_the_keys_just_before_a_key() {
        let d = dir_of(&ObjectUrl::parse("s3://b/train/a/x.jpg").unwrap());
        assert_eq!((d.url.as_str(), d.key.as_str()), ("s3://b/train/a", "train/a"));
        let top = dir_of(&ObjectUrl::parse("s3://b/x.jpg").unwrap());
        assert_eq!((top.url.as_str(), top.key.as_str()), ("s3://b", ""));
        assert!(in_dir("train/a", "train/a/x") && !in_dir("train/a", "train/a/sub/x") && in_dir("", "x"));
        assert_eq!(just_before("train/a/x1").as_deref(), Some("train/a/x"));
        assert_eq!(just_before("train/a/x").as_deref(), Some("train/a"), "no trailing /");
        assert_eq!(just_before("x"), None);
        assert_eq!(just_before("é"), None);
        for key in ["train/a/x1", "train/a/x", "a/b0", "a/é"] {
            assert!(just_before(key).unwrap().as_str() < key);
        }
    }
}
