//! Listings kept fresh ahead of their TTL (issue 29): a revalidation blocks the read that needs it
//! for one LIST (100-300 ms of S3 for a page of 1,000 keys), and an epoch that starts after the
//! TTL meets that stall on every directory at once, which costs as much as reading the
//! directory's objects from the SSD. So the slot that owns a directory lists it again when its
//! page is half a TTL old, as long as a slot of the fleet asked for versions of it within the last
//! [`KEEP_TTLS`] TTLs, and confirms the versions to each slot that asked (`Request::Confirm`),
//! which keeps them for the objects it holds metadata of: their reads never find it expired.
//!
//! A slot that starts with the metadata a clean stop saved asks, once its index is rebuilt, for a
//! version of one object of each directory it holds metadata of (read with the default chunk size,
//! 1 MiB): the listings that answer keep those directories fresh from then on, so the first epoch
//! after a restart does not wait for them either.
//!
//! Only directories of one page (up to 1,999 keys) are refreshed so; one larger is revalidated
//! when read, a page at a time. In a cluster, nodes that asked through the peer protocol are not
//! kept informed (they revalidate when they read). The cost: one LIST per directory per half TTL
//! or so while the job runs; nothing once no slot has asked for [`KEEP_TTLS`] TTLs.

use std::sync::Arc;
use std::time::Duration;

use memarts_protocol::{
    ConfirmedMeta, ErrorCode, ObjectUrl, OriginKind, Request, WireError, MAX_REVALIDATED,
};

use super::revalidate::dir_of;
use super::Metadata;

/// A directory is kept fresh while a slot asked for versions of it within this many TTLs.
pub const KEEP_TTLS: u32 = 10;

/// Encoded bytes of versions in one `Confirm`, about: well within a request's 64 KiB.
const CONFIRM_BYTES: usize = 32 << 10;

impl Metadata {
    /// Starts the slot's refresher, until the slot goes: every quarter of the TTL, the
    /// directories this slot owns that are due are listed again and their versions confirmed.
    pub fn start_refresher(self: &Arc<Self>) {
        if self.info.passthrough {
            return;
        }
        let metadata = Arc::downgrade(self);
        let period = (self.cache.ttl() / 4).max(Duration::from_millis(250));
        tokio::spawn(async move {
            loop {
                let Some(metadata) = metadata.upgrade() else { return };
                if metadata.index_ready() {
                    // What the snapshot brought back (taken in before the index is ready), with
                    // what the first reads put meanwhile: their directories are read too.
                    let loaded = metadata.cache.urls();
                    metadata.ask_about_loaded(loaded).await;
                    break;
                }
                drop(metadata);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let mut tick = tokio::time::interval(period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(metadata) = metadata.upgrade() else { return };
                metadata.refresh_due().await;
            }
        });
    }

    /// One revalidation per directory of the object-store metadata `loaded` from a snapshot: its
    /// answer brings the directory's versions, and the directory is kept fresh.
    async fn ask_about_loaded(self: &Arc<Self>, loaded: Vec<String>) {
        let mut dirs = std::collections::BTreeMap::new();
        for url in loaded {
            if let Ok(parsed) = ObjectUrl::parse(&url) {
                if parsed.kind == OriginKind::S3 {
                    dirs.entry(dir_of(&parsed).url).or_insert(url);
                }
            }
        }
        for url in dirs.into_values() {
            let Ok(parsed) = ObjectUrl::parse(&url) else { continue };
            let cs = Some(memarts_protocol::DEFAULT_CHUNK_SIZE);
            if let Some((meta, ago)) = self.revalidate_by_listing(&parsed, cs).await {
                self.cache.put_confirmed(url, meta, ago);
            }
        }
    }

    /// Lists again each due directory and confirms its versions to the slots that asked.
    pub(super) async fn refresh_due(self: &Arc<Self>) {
        let ttl = self.cache.ttl();
        for (dir_url, askers) in self.dir_versions.due(ttl / 2, ttl * KEEP_TTLS) {
            let Ok(url) = ObjectUrl::parse(&format!("{dir_url}/x")) else { continue };
            let dir = dir_of(&url);
            if url.kind != OriginKind::S3 || !self.list_page_of(&dir, "").await {
                continue;
            }
            self.counters.refreshed_listings.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            for asker in askers {
                let versions = self.versions_served(&dir, asker);
                if asker.slot == self.info.slot {
                    self.keep_confirmed(versions);
                    continue;
                }
                let Some(siblings) = self.siblings.get() else { continue };
                for batch in confirm_batches(versions) {
                    if let Err(e) = siblings.call(asker.slot, &Request::Confirm(batch)).await {
                        // Its metadata then expires, and its next read revalidates.
                        tracing::debug!("slot {} did not take the versions of {dir_url}: {e}", asker.slot);
                    }
                }
            }
        }
    }

    /// `Request::Confirm` from the slot that owns a directory: versions confirmed again, kept for
    /// the objects this slot holds metadata of (never one it does not: it asked for none).
    pub fn serve_confirm(&self, versions: Vec<(String, ConfirmedMeta)>) -> Result<(), WireError> {
        if versions.len() > MAX_REVALIDATED {
            let why = format!("more than {MAX_REVALIDATED} versions in one Confirm");
            return Err(WireError::new(ErrorCode::BadRequest, why));
        }
        for (url, _) in &versions {
            match ObjectUrl::parse(url) {
                Ok(u) if u.kind == OriginKind::S3 && u.to_string() == *url => {}
                _ => {
                    return Err(WireError::new(
                        ErrorCode::BadRequest,
                        format!("{url:?} is not an object URL"),
                    ))
                }
            }
        }
        self.keep_confirmed(versions);
        Ok(())
    }

    fn keep_confirmed(&self, versions: Vec<(String, ConfirmedMeta)>) {
        for (url, c) in versions {
            if self.cache.get_stale(&url).is_some() {
                self.cache.put_confirmed(url, c.meta, Duration::from_millis(c.confirmed_ms_ago));
            }
        }
    }
}

/// `versions` in messages of about [`CONFIRM_BYTES`] each.
fn confirm_batches(versions: Vec<(String, ConfirmedMeta)>) -> Vec<Vec<(String, ConfirmedMeta)>> {
    super::listings::batched(versions, CONFIRM_BYTES, |(url, c)| {
        url.len() + c.meta.etag.as_ref().map_or(0, String::len) + 40
    })
}
