//! Listings, one page at a time: at most `max_entries` entries after `start_after`, and where the
//! next page starts. An object store lists keys in their byte order, and a page continues after the
//! last key of the one before (`list_with_offset`); a local directory is walked in an order of its
//! own that pages can continue in (`local_list.rs`), each file's metadata read as a HEAD of it reads
//! it, so that its ETag is the one its reads will check.

use futures::{StreamExt, TryStreamExt};
use memarts_protocol::{ListEntry, ListPage, ListRequest, ObjectUrl, OriginKind};
use object_store::path::Path;
use object_store::ObjectStore;

use super::retry::Label;
use super::{Op, Origin, OriginError};

/// HEADs of a local page's files at once.
const LOCAL_HEADS: usize = 32;

impl Origin {
    /// One page of a listing. Non-recursive listings report common prefixes as directories.
    pub async fn list(&self, req: &ListRequest) -> Result<ListPage, OriginError> {
        let url = ObjectUrl::parse(&req.url).map_err(|e| OriginError::BadRequest(e.to_string()))?;
        let max = req.max_entries.clamp(1, 10_000) as usize;
        let op = if req.recursive { "LIST-R" } else { "LIST" };
        let mut entries: Vec<ListEntry> = self
            .policy
            .run(
                Label { op, target: &url },
                0,
                || self.count_retry(),
                || {
                    self.request(Op::List, async {
                        match url.kind {
                            OriginKind::S3 => self.list_keys(&url, req, max + 1).await,
                            OriginKind::Local => self.list_local(&url, req, max + 1).await,
                        }
                    })
                },
            )
            .await?;
        let next = if entries.len() > max {
            entries.truncate(max);
            entries.last().map(|e| e.url.clone())
        } else {
            None
        };
        Ok(ListPage { entries, next })
    }

    /// At most `n` entries of an object store's listing, in key order.
    async fn list_keys(
        &self,
        url: &ObjectUrl,
        req: &ListRequest,
        n: usize,
    ) -> Result<Vec<ListEntry>, OriginError> {
        let store = self.store_for(url)?;
        let prefix = Self::path_of(url)?;
        let prefix = (!prefix.as_ref().is_empty()).then_some(prefix);
        let entry_url = |p: &Path| format!("s3://{}/{p}", url.bucket);
        if req.recursive {
            let stream = match &req.start_after {
                Some(after) => {
                    let after =
                        ObjectUrl::parse(after).map_err(|e| OriginError::BadRequest(e.to_string()))?;
                    store.list_with_offset(prefix.as_ref(), &Self::path_of(&after)?)
                }
                None => store.list(prefix.as_ref()),
            };
            let metas: Vec<_> = stream.take(n).try_collect().await.map_err(|e| self.classify(e, url))?;
            return Ok(metas.iter().map(|m| entry(entry_url(&m.location), m)).collect());
        }
        let res = store.list_with_delimiter(prefix.as_ref()).await.map_err(|e| self.classify(e, url))?;
        let dirs = res.common_prefixes.iter().map(|p| ListEntry {
            url: entry_url(p),
            is_dir: true,
            size: 0,
            etag: None,
            last_modified_ms: 0,
        });
        let files = res.objects.iter().map(|m| entry(entry_url(&m.location), m));
        let mut all: Vec<ListEntry> = dirs.chain(files).collect();
        all.sort_by(|a, b| a.url.cmp(&b.url));
        if let Some(after) = &req.start_after {
            all.retain(|e| e.url.as_str() > after.as_str());
        }
        all.truncate(n);
        Ok(all)
    }

    /// At most `n` entries of a local directory's listing (`local_list.rs`), each file's metadata
    /// as its HEAD reads it.
    async fn list_local(
        &self,
        url: &ObjectUrl,
        req: &ListRequest,
        n: usize,
    ) -> Result<Vec<ListEntry>, OriginError> {
        let root = std::path::PathBuf::from(&url.key);
        let after = match &req.start_after {
            Some(after) => {
                let after = ObjectUrl::parse(after).map_err(|e| OriginError::BadRequest(e.to_string()))?;
                Some(std::path::PathBuf::from(after.key))
            }
            None => None,
        };
        let recursive = req.recursive;
        let listings = self.local_listings.clone();
        let walked =
            tokio::task::spawn_blocking(move || listings.page(&root, recursive, after.as_deref(), n)).await;
        let found = match walked {
            Ok(Ok(found)) => found,
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                return Err(OriginError::PermissionDenied(format!("{url}: {e}")))
            }
            Ok(Err(e)) => return Err(OriginError::Failed(format!("{url}: {e}"))),
            Err(e) => return Err(OriginError::Failed(format!("{url}: the listing stopped: {e}"))),
        };
        let store = self.local.clone();
        futures::stream::iter(found)
            .map(|f| {
                let store = store.clone();
                async move {
                    let url = f.path.display().to_string();
                    if f.is_dir {
                        return Ok(Some(ListEntry {
                            url,
                            is_dir: true,
                            size: 0,
                            etag: None,
                            last_modified_ms: 0,
                        }));
                    }
                    // A name no URL can read back (object_store's rules) is not listed.
                    let Ok(path) = Path::parse(url.trim_start_matches('/')) else { return Ok(None) };
                    match store.head(&path).await {
                        Ok(m) => Ok(Some(entry(url, &m))),
                        // Gone since the directory was read: not in the listing.
                        Err(object_store::Error::NotFound { .. }) => Ok(None),
                        Err(e) => Err(OriginError::from_store(e)),
                    }
                }
            })
            .buffered(LOCAL_HEADS)
            .try_filter_map(|e| async move { Ok(e) })
            .try_collect()
            .await
    }
}

fn entry(url: String, m: &object_store::ObjectMeta) -> ListEntry {
    ListEntry {
        url,
        is_dir: false,
        size: m.size,
        etag: m.e_tag.clone(),
        last_modified_ms: m.last_modified.timestamp_millis(),
    }
}
