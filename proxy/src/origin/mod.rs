//! The origin: where the truth lives. One `object_store` client per S3 bucket on the configured
//! endpoint, the local file system for plain paths, and the policies every request goes through:
//! `If-Match` on every ranged GET, a check that exactly the requested bytes came back, deadlines sized
//! for the request and retries (see [`retry`]).
//!
//! Credentials come from a credentials file that is re-read when it changes or expires
//! (`credentials_file` in the config, see [`credentials`]), else from the standard `AWS_*`
//! environment (one explicit `from_env()`), never from a client. Without either the client signs
//! nothing, rather than probing a cloud metadata service that does not exist on a training node.

pub mod credentials;
mod error;
mod list;
mod local_list;
mod request_log;
pub mod retry;
mod stats;
mod upload;

#[cfg(test)]
mod fault_tests;
#[cfg(test)]
pub(crate) mod faulty;

use std::num::NonZeroUsize;
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use dashmap::DashMap;
use lru::LruCache;
use memarts_protocol::{ObjectMeta, ObjectUrl, OriginKind};
use object_store::aws::{AmazonS3Builder, AwsCredential, AwsCredentialProvider};
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{
    ClientOptions, GetOptions, GetRange, GetResult, ObjectStore, RetryConfig, StaticCredentialProvider,
    WriteMultipart,
};

pub use credentials::FileCredentialProvider;
pub use error::OriginError;
use retry::{Label, RetryPolicy};
pub use stats::{Op, OriginStats};
pub use upload::Upload;

use crate::config::OriginConfig;

/// S3 clients kept, one per bucket, the least recently used dropped first. Bucket names come from
/// clients and each client costs about 100 KiB and an idle connection to the endpoint: without a
/// bound, requests naming ever new buckets grow the proxy without limit (R2).
const MAX_BUCKET_CLIENTS: usize = 64;

/// Access to every origin a URL can name.
pub struct Origin {
    cfg: OriginConfig,
    policy: RetryPolicy,
    /// S3 clients built on demand, at most [`MAX_BUCKET_CLIENTS`].
    buckets: Mutex<LruCache<String, Arc<dyn ObjectStore>>>,
    /// Stores a test put in place of S3 clients; never dropped.
    fixed: DashMap<String, Arc<dyn ObjectStore>>,
    local: Arc<dyn ObjectStore>,
    /// Local directories' sorted names, for the pages of their listings (`local_list.rs`).
    local_listings: Arc<local_list::LocalListings>,
    /// Signs every S3 request (each bucket's client asks it per request, so a provider that re-reads
    /// its file rotates credentials without a restart); `None` means unsigned requests.
    credentials: Option<AwsCredentialProvider>,
    pub stats: OriginStats,
}

impl Origin {
    /// Builds the origin. S3 credentials come from `cfg.credentials_file` when it is set (read now:
    /// a missing or invalid file is an error naming it), else from `AWS_ACCESS_KEY_ID`,
    /// `AWS_SECRET_ACCESS_KEY` and `AWS_SESSION_TOKEN`.
    pub fn from_env(cfg: OriginConfig) -> Result<Origin, OriginError> {
        if let Some(path) = &cfg.credentials_file {
            let provider = FileCredentialProvider::open(path).map_err(OriginError::from)?;
            tracing::info!(
                "S3 credentials from the credentials file {}, {}",
                path.display(),
                credentials::describe_expiry(provider.expires())
            );
            return Ok(Self::with_credential_provider(cfg, Arc::new(provider)));
        }
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let credentials = match (var("AWS_ACCESS_KEY_ID"), var("AWS_SECRET_ACCESS_KEY")) {
            (Some(key_id), Some(secret)) => Some((key_id, secret, var("AWS_SESSION_TOKEN"))),
            _ => None,
        };
        Ok(Self::new(cfg, credentials))
    }

    /// Builds the origin with explicit credentials (`key id, secret, session token`).
    pub fn new(cfg: OriginConfig, credentials: Option<(String, String, Option<String>)>) -> Origin {
        let provider = credentials.map(|(key_id, secret_key, token)| {
            let credential = AwsCredential { key_id, secret_key, token };
            Arc::new(StaticCredentialProvider::new(credential)) as AwsCredentialProvider
        });
        Self::build(cfg, provider)
    }

    /// Builds the origin with S3 requests signed by `provider`, e.g. a [`FileCredentialProvider`].
    pub fn with_credential_provider(cfg: OriginConfig, provider: AwsCredentialProvider) -> Origin {
        Self::build(cfg, Some(provider))
    }

    fn build(cfg: OriginConfig, credentials: Option<AwsCredentialProvider>) -> Origin {
        Origin {
            policy: RetryPolicy::from_config(&cfg),
            cfg,
            buckets: Mutex::new(LruCache::new(NonZeroUsize::new(MAX_BUCKET_CLIENTS).expect("non-zero"))),
            fixed: DashMap::new(),
            local: Arc::new(LocalFileSystem::new()),
            local_listings: Arc::default(),
            credentials,
            stats: OriginStats::default(),
        }
    }

    /// Appends a line per origin request attempt to `path` (MoXing's `MOX_OBS_CLIENT_LOG`).
    pub fn with_request_log(mut self, path: &std::path::Path) -> std::io::Result<Origin> {
        self.policy.log = Some(Arc::new(request_log::RequestLog::open(path)?));
        Ok(self)
    }

    /// Uses `store` for `bucket` instead of building an S3 client (tests: `InMemory`, fault injectors).
    pub fn with_bucket_store(self, bucket: &str, store: Arc<dyn ObjectStore>) -> Origin {
        self.fixed.insert(bucket.to_string(), store);
        self
    }

    pub fn policy(&self) -> &RetryPolicy {
        &self.policy
    }

    /// S3 clients held now.
    #[cfg(test)]
    fn bucket_clients(&self) -> usize {
        self.buckets.lock().unwrap().len()
    }

    /// Keeps at most `n` S3 clients (tests: building one takes tens of milliseconds).
    #[cfg(test)]
    fn with_bucket_capacity(self, n: usize) -> Origin {
        self.buckets.lock().unwrap().resize(NonZeroUsize::new(n).unwrap());
        self
    }

    fn store_for(&self, url: &ObjectUrl) -> Result<Arc<dyn ObjectStore>, OriginError> {
        match url.kind {
            OriginKind::Local => Ok(self.local.clone()),
            OriginKind::S3 => {
                if let Some(store) = self.fixed.get(&url.bucket) {
                    return Ok(store.clone());
                }
                // Nothing configured at all: say what to set, rather than retry unsigned requests
                // against AWS's public endpoint (AWS itself is `AWS_ENDPOINT_URL=https://s3.amazonaws.com`).
                if self.cfg.endpoint.is_none() && self.credentials.is_none() {
                    return Err(OriginError::NotConfigured(format!(
                        "{url}: no object store is configured: set AWS_ENDPOINT_URL (your object store's \
                         endpoint, e.g. https://obs.cn-north-4.myhuaweicloud.com, or https://s3.amazonaws.com \
                         for AWS), AWS_REGION, and AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or \
                         MEMARTS_CREDENTIALS_FILE)"
                    )));
                }
                if !is_bucket_name(&url.bucket) {
                    // It goes into the request URL as it is: a space or a control character made
                    // object_store panic building the request, a `#` or `?` named another bucket.
                    return Err(OriginError::BadRequest(format!(
                        "bucket name {:?}: ASCII letters, digits, '.', '-' and '_', starting and ending \
                         with a letter or digit, at most 255",
                        url.bucket
                    )));
                }
                let buckets = || self.buckets.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(store) = buckets().get(&url.bucket) {
                    return Ok(store.clone());
                }
                let store = self.build_s3(&url.bucket)?;
                Ok(buckets().get_or_insert(url.bucket.clone(), || store).clone())
            }
        }
    }

    fn build_s3(&self, bucket: &str) -> Result<Arc<dyn ObjectStore>, OriginError> {
        let client = ClientOptions::new()
            .with_connect_timeout(Duration::from_secs_f64(self.cfg.connect_timeout_secs))
            // Our per-request deadline (retry::RetryPolicy) bounds each attempt by its size; this
            // one only has to be longer than any of them.
            .with_timeout(Duration::from_secs(24 * 3600))
            .with_allow_http(self.cfg.allow_http);
        let mut b = AmazonS3Builder::new()
            .with_bucket_name(bucket)
            .with_region(self.cfg.region.clone().unwrap_or_else(|| "us-east-1".into()))
            .with_virtual_hosted_style_request(self.cfg.virtual_hosted_style)
            .with_allow_http(self.cfg.allow_http)
            .with_client_options(client)
            .with_retry(RetryConfig { max_retries: 0, ..RetryConfig::default() });
        if let Some(endpoint) = &self.cfg.endpoint {
            b = b.with_endpoint(endpoint);
        }
        match &self.credentials {
            Some(provider) => b = b.with_credentials(provider.clone()),
            None => b = b.with_skip_signature(true),
        }
        let store = b
            .build()
            .map_err(|e| OriginError::BadRequest(format!("S3 client for bucket {bucket:?}: {e}")))?;
        Ok(Arc::new(store))
    }

    fn path_of(url: &ObjectUrl) -> Result<Path, OriginError> {
        let key = match url.kind {
            OriginKind::Local => url.key.trim_start_matches('/'),
            OriginKind::S3 => url.key.as_str(),
        };
        Path::parse(key).map_err(|e| OriginError::BadRequest(format!("key {key:?}: {e}")))
    }

    /// Metadata of the current version of `url` (a HEAD request).
    pub async fn head(&self, url: &ObjectUrl) -> Result<ObjectMeta, OriginError> {
        let store = self.store_for(url)?;
        let path = Self::path_of(url)?;
        let meta = self
            .policy
            .run(
                Label { op: "HEAD", target: url },
                0,
                || self.count_retry(),
                || {
                    self.request(Op::Head, async {
                        store.head(&path).await.map_err(|e| self.classify(e, url))
                    })
                },
            )
            .await?;
        Ok(to_meta(&meta))
    }

    /// Exactly the bytes `range` of the version `etag` of `url`. A different version is `Stale`; a
    /// short, long or misplaced body is retried and never returned.
    pub async fn get_range(
        &self,
        url: &ObjectUrl,
        range: Range<u64>,
        etag: &str,
    ) -> Result<Bytes, OriginError> {
        if !is_header_value(etag) {
            // object_store would put it in an If-Match header anyway, fail to build the request and
            // panic signing it (`expect("request valid")`).
            return Err(OriginError::BadRequest(format!(
                "ETag {etag:?} cannot be sent in an If-Match header"
            )));
        }
        let store = self.store_for(url)?;
        let path = Self::path_of(url)?;
        let want = range.end - range.start;
        let target = format!("{url} bytes={}-{} if-match={etag}", range.start, range.end.saturating_sub(1));
        self.policy
            .run(
                Label { op: "GET", target: &target },
                want,
                || self.count_retry(),
                || {
                    self.request(Op::Get, async {
                        let opts = GetOptions {
                            if_match: Some(etag.to_string()),
                            range: Some(GetRange::Bounded(range.clone())),
                            ..GetOptions::default()
                        };
                        let res = store.get_opts(&path, opts).await.map_err(|e| self.classify(e, url))?;
                        if let Some(got) = res.meta.e_tag.as_deref() {
                            // Servers that ignore If-Match still report the version they served.
                            if got != etag {
                                return Err(OriginError::Stale(format!("{url} (ETag {got}, not {etag})")));
                            }
                        }
                        self.exact_body(url, res, range.clone()).await
                    })
                },
            )
            .await
    }

    /// The body of `res`, which must be exactly the bytes `want`: a response for another range, or a
    /// body of another length, is `Malformed` (retried, never returned).
    async fn exact_body(
        &self,
        url: &ObjectUrl,
        res: GetResult,
        want: Range<u64>,
    ) -> Result<Bytes, OriginError> {
        if res.range != want {
            return Err(OriginError::Malformed(format!(
                "{url}: asked for bytes {want:?}, the origin answered {:?}",
                res.range
            )));
        }
        let bytes = res.bytes().await.map_err(OriginError::from_store)?;
        let len = want.end - want.start;
        if bytes.len() as u64 != len {
            return Err(OriginError::Malformed(format!(
                "{url}: body of {} bytes for a range of {len}",
                bytes.len()
            )));
        }
        self.stats.bytes.fetch_add(len, Ordering::Relaxed);
        Ok(bytes)
    }

    /// The current version's metadata and its first `len` bytes (fewer if the object is shorter), in
    /// one ranged GET: what a cold read needs to start, without a HEAD first. One attempt only: on
    /// any failure the caller takes the usual way (HEAD, then GET, each with retries), which also
    /// covers origins that refuse a range of an empty object. A body that does not match the range
    /// the origin reports is never returned.
    pub async fn get_first(&self, url: &ObjectUrl, len: u64) -> Result<(ObjectMeta, Bytes), OriginError> {
        let store = self.store_for(url)?;
        let path = Self::path_of(url)?;
        let target = format!("{url} bytes=0-{}", len.saturating_sub(1));
        let once = RetryPolicy { max_attempts: 1, ..self.policy.clone() };
        once.run(
            Label { op: "GET", target: &target },
            len,
            || self.count_retry(),
            || {
                self.request(Op::Get, async {
                    let opts = GetOptions { range: Some(GetRange::Bounded(0..len)), ..GetOptions::default() };
                    let res = store.get_opts(&path, opts).await.map_err(|e| self.classify(e, url))?;
                    let meta = to_meta(&res.meta);
                    let bytes = self.exact_body(url, res, 0..len.min(meta.size)).await?;
                    Ok((meta, bytes))
                })
            },
        )
        .await
        .inspect_err(|e| {
            // The caller asks again another way (HEAD, then GET): that is a retry of this request.
            if e.is_retryable() {
                self.count_retry();
            }
        })
    }

    /// Deletes `url` at the origin; deleting an absent object is not an error.
    pub async fn delete(&self, url: &ObjectUrl) -> Result<(), OriginError> {
        let store = self.store_for(url)?;
        let path = Self::path_of(url)?;
        self.policy
            .run(
                Label { op: "DELETE", target: url },
                0,
                || self.count_retry(),
                || {
                    self.request(Op::Delete, async {
                        match store.delete(&path).await {
                            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                            Err(e) => Err(OriginError::from_store(e)),
                        }
                    })
                },
            )
            .await
    }

    /// Starts writing a new version of `url` (a multipart upload, parts of `part_size` bytes).
    pub async fn start_upload(&self, url: &ObjectUrl, part_size: usize) -> Result<Upload, OriginError> {
        let store = self.store_for(url)?;
        let path = Self::path_of(url)?;
        let upload = self
            .request(Op::Put, async { store.put_multipart(&path).await.map_err(OriginError::from_store) });
        let upload = upload.await?;
        Ok(Upload::new(WriteMultipart::new_with_chunk_size(upload, part_size), store, path))
    }

    /// An object_store error as ours, counting throttling answers.
    /// An object_store error of a request about `url`, classified (and counted if a throttle).
    fn classify(&self, e: object_store::Error, url: &impl std::fmt::Display) -> OriginError {
        let e = OriginError::from_store(e).about(url);
        if e.is_throttle() {
            self.stats.throttled.fetch_add(1, Ordering::Relaxed);
        }
        e
    }

    /// One request to the origin: counted, timed, and its outcome recorded (`stats.rs`).
    async fn request<T>(
        &self,
        op: Op,
        attempt: impl std::future::Future<Output = Result<T, OriginError>>,
    ) -> Result<T, OriginError> {
        self.stats.requests.fetch_add(1, Ordering::Relaxed);
        let started = std::time::Instant::now();
        let result = attempt.await;
        self.stats.record(op, started, result.as_ref().map(|_| ()));
        result
    }

    fn count_retry(&self) {
        self.stats.retries.fetch_add(1, Ordering::Relaxed);
    }
}

/// Whether `s` can be a bucket name: what S3 (legacy names included), OBS and OSS allow, and
/// nothing that means something in a URL (`..` as a bucket would name the next path segment).
fn is_bucket_name(s: &str) -> bool {
    let edge = |b: Option<&u8>| b.is_some_and(u8::is_ascii_alphanumeric);
    s.len() <= 255
        && edge(s.as_bytes().first())
        && edge(s.as_bytes().last())
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b".-_".contains(&b))
}

/// Whether `s` can be an HTTP header value: no control characters (ETags never hold any).
fn is_header_value(s: &str) -> bool {
    !s.bytes().any(|b| b.is_ascii_control())
}

fn to_meta(m: &object_store::ObjectMeta) -> ObjectMeta {
    ObjectMeta {
        size: m.size,
        etag: m.e_tag.clone(),
        version: m.version.clone(),
        last_modified_ms: m.last_modified.timestamp_millis(),
    }
}

#[cfg(test)]
#[path = "origin_tests.rs"]
mod tests;
