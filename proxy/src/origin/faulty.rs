//! A fault-injecting origin for tests: wraps any `ObjectStore` (usually `InMemory`) and applies a
//! scripted queue of faults, one per GET or HEAD in arrival order; an empty queue passes requests
//! through. It also counts GETs and HEADs so tests can assert how many requests a call made.
//!
//! Each fault imitates what an S3 client reports for the real thing: 5xx and resets arrive as
//! `object_store::Error::Generic`, a replaced object makes `If-Match` fail with `Precondition` (412).

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::stream::{self, BoxStream, StreamExt};
use object_store::path::Path;
use object_store::{
    GetOptions, GetRange, GetResult, GetResultPayload, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, Result,
};

/// What happens to one request.
#[derive(Debug, Clone)]
pub enum Fault {
    /// 503 SlowDown.
    Unavailable,
    /// 500 Internal Error.
    Internal,
    /// The connection is reset before any byte of the answer.
    Reset,
    /// The body stops after this many bytes; the answer still claims the whole range.
    Truncate(usize),
    /// The body yields this many bytes, then an error.
    BodyError(usize),
    /// Nothing happens for this long, then the request is answered normally.
    Stall(Duration),
    /// The answer covers the requested range shifted one byte forward, and says so.
    WrongRange,
    /// The object is overwritten with these bytes (a new ETag) just before the request is served.
    Replace(Bytes),
}

#[derive(Debug)]
pub struct FaultyStore {
    inner: Arc<dyn ObjectStore>,
    faults: Mutex<VecDeque<Fault>>,
    gets: AtomicU64,
    heads: AtomicU64,
    lists: AtomicU64,
    listed_keys: Arc<AtomicU64>,
    refuse_listings: std::sync::atomic::AtomicBool,
    if_matches: Mutex<Vec<Option<String>>>,
}

impl FaultyStore {
    pub fn new(inner: Arc<dyn ObjectStore>) -> FaultyStore {
        FaultyStore {
            inner,
            faults: Mutex::default(),
            gets: AtomicU64::new(0),
            heads: AtomicU64::new(0),
            lists: AtomicU64::new(0),
            listed_keys: Arc::default(),
            refuse_listings: Default::default(),
            if_matches: Mutex::default(),
        }
    }

    /// Appends faults for the next requests, in order.
    pub fn script(&self, faults: impl IntoIterator<Item = Fault>) {
        self.faults.lock().unwrap().extend(faults);
    }

    /// Scripted faults not yet applied.
    pub fn pending(&self) -> usize {
        self.faults.lock().unwrap().len()
    }

    /// GET requests received (HEADs excluded), faulty or not.
    pub fn gets(&self) -> u64 {
        self.gets.load(Ordering::SeqCst)
    }

    /// HEAD requests received, faulty or not.
    pub fn heads(&self) -> u64 {
        self.heads.load(Ordering::SeqCst)
    }

    /// Listings asked for (`list`, from the start or from an offset), faulty or not.
    pub fn lists(&self) -> u64 {
        self.lists.load(Ordering::SeqCst)
    }

    /// Whether listings are refused from now on, as a bucket policy without `s3:ListBucket` does.
    pub fn refuse_listings(&self, refuse: bool) {
        self.refuse_listings.store(refuse, Ordering::SeqCst);
    }

    /// Keys the listings sent (from their offset on, as an object store sends them).
    pub fn listed_keys(&self) -> u64 {
        self.listed_keys.load(Ordering::SeqCst)
    }

    /// The `If-Match` of every GET received, in order.
    pub fn if_matches(&self) -> Vec<Option<String>> {
        self.if_matches.lock().unwrap().clone()
    }

    /// A listing's stream with the next scripted fault applied, its keys counted.
    fn listing(
        &self,
        inner: BoxStream<'static, Result<ObjectMeta>>,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        let counted = self.listed_keys.clone();
        let inner = inner
            .inspect(move |m| {
                if m.is_ok() {
                    counted.fetch_add(1, Ordering::SeqCst);
                }
            })
            .boxed();
        if self.refuse_listings.load(Ordering::SeqCst) {
            let refused =
                object_store::Error::PermissionDenied { path: "list".into(), source: "refused".into() };
            return futures::stream::once(async move { Err(refused) }).boxed();
        }
        let fault = self.faults.lock().unwrap().pop_front();
        match fault {
            None => inner,
            Some(Fault::Stall(pause)) => {
                let wait = futures::stream::once(async move {
                    tokio::time::sleep(pause).await;
                    None
                });
                wait.chain(inner.map(Some)).filter_map(futures::future::ready).boxed()
            }
            Some(other) => futures::stream::once(async move {
                Err(object_store::Error::Generic { store: "faulty", source: format!("{other:?}").into() })
            })
            .boxed(),
        }
    }

    /// The wrapped store, to set up or inspect objects without faults or counting.
    pub fn inner(&self) -> &Arc<dyn ObjectStore> {
        &self.inner
    }

    /// Counts a request and takes its fault.
    fn arrive(&self, head: bool) -> Option<Fault> {
        let counter = if head { &self.heads } else { &self.gets };
        counter.fetch_add(1, Ordering::SeqCst);
        self.faults.lock().unwrap().pop_front()
    }

    /// Applies the part of a fault that comes before the inner store answers: an error instead of
    /// an answer, a stall, a new version. Returns the fault if it acts on the answer itself.
    async fn before_answer(&self, location: &Path, fault: Option<Fault>) -> Result<Option<Fault>> {
        match fault {
            Some(Fault::Unavailable) => Err(generic("503 Slow Down: please reduce your request rate")),
            Some(Fault::Internal) => Err(generic("500 Internal Error")),
            Some(Fault::Reset) => Err(object_store::Error::Generic {
                store: STORE,
                source: Box::new(std::io::Error::from(std::io::ErrorKind::ConnectionReset)),
            }),
            Some(Fault::Stall(d)) => {
                tokio::time::sleep(d).await;
                Ok(None)
            }
            Some(Fault::Replace(bytes)) => {
                self.inner.put(location, bytes.into()).await?;
                Ok(None)
            }
            other => Ok(other),
        }
    }

    async fn get(&self, location: &Path, mut options: GetOptions) -> Result<GetResult> {
        if !options.head {
            self.if_matches.lock().unwrap().push(options.if_match.clone());
        }
        let fault = self.before_answer(location, self.arrive(options.head)).await?;
        match fault {
            None => self.inner.get_opts(location, options).await,
            Some(fault) if options.head => panic!("{fault:?} acts on a body; a HEAD has none"),
            Some(Fault::WrongRange) => {
                let Some(GetRange::Bounded(r)) = &options.range else {
                    panic!("WrongRange needs a bounded range, got {:?}", options.range);
                };
                options.range = Some(GetRange::Bounded(r.start + 1..r.end + 1));
                self.inner.get_opts(location, options).await
            }
            Some(Fault::Truncate(n)) => {
                let res = self.inner.get_opts(location, options).await?;
                rebody(res, |data| vec![Ok(data.slice(..n.min(data.len())))]).await
            }
            Some(Fault::BodyError(n)) => {
                let res = self.inner.get_opts(location, options).await?;
                rebody(res, |data| {
                    vec![Ok(data.slice(..n.min(data.len()))), Err(generic("connection reset mid-body"))]
                })
                .await
            }
            Some(other) => unreachable!("{other:?} is applied before the answer"),
        }
    }

    async fn head(&self, location: &Path) -> Result<ObjectMeta> {
        match self.before_answer(location, self.arrive(true)).await? {
            None => self.inner.head(location).await,
            Some(fault) => panic!("{fault:?} acts on a body; a HEAD has none"),
        }
    }
}

const STORE: &str = "FaultyStore";

fn generic(msg: &str) -> object_store::Error {
    object_store::Error::Generic { store: STORE, source: msg.into() }
}

/// Reads the inner answer whole and serves `body(data)` instead, under the same metadata and range.
async fn rebody(res: GetResult, body: impl FnOnce(Bytes) -> Vec<Result<Bytes>>) -> Result<GetResult> {
    let (meta, range, attributes) = (res.meta.clone(), res.range.clone(), res.attributes.clone());
    let data = res.bytes().await?;
    let payload = GetResultPayload::Stream(stream::iter(body(data)).boxed());
    Ok(GetResult { payload, meta, range, attributes })
}

impl fmt::Display for FaultyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FaultyStore({})", self.inner)
    }
}

// `ObjectStore` is an `#[async_trait]` trait; without that macro here, its methods are written in
// their expanded form: a boxed future borrowing the arguments.
impl ObjectStore for FaultyStore {
    fn get_opts<'a, 'b, 'f>(
        &'a self,
        location: &'b Path,
        options: GetOptions,
    ) -> BoxFuture<'f, Result<GetResult>>
    where
        'a: 'f,
        'b: 'f,
    {
        Box::pin(self.get(location, options))
    }

    fn head<'a, 'b, 'f>(&'a self, location: &'b Path) -> BoxFuture<'f, Result<ObjectMeta>>
    where
        'a: 'f,
        'b: 'f,
    {
        Box::pin(FaultyStore::head(self, location))
    }

    fn put_opts<'a, 'b, 'f>(
        &'a self,
        location: &'b Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> BoxFuture<'f, Result<PutResult>>
    where
        'a: 'f,
        'b: 'f,
    {
        self.inner.put_opts(location, payload, opts)
    }

    fn put_multipart_opts<'a, 'b, 'f>(
        &'a self,
        location: &'b Path,
        opts: PutMultipartOptions,
    ) -> BoxFuture<'f, Result<Box<dyn MultipartUpload>>>
    where
        'a: 'f,
        'b: 'f,
    {
        self.inner.put_multipart_opts(location, opts)
    }

    fn delete<'a, 'b, 'f>(&'a self, location: &'b Path) -> BoxFuture<'f, Result<()>>
    where
        'a: 'f,
        'b: 'f,
    {
        self.inner.delete(location)
    }

    /// Counted as a listing; a scripted `Stall` holds its first page back, any other fault fails it.
    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.lists.fetch_add(1, Ordering::SeqCst);
        self.listing(self.inner.list(prefix))
    }

    /// As `list`, from after `offset`.
    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        self.lists.fetch_add(1, Ordering::SeqCst);
        self.listing(self.inner.list_with_offset(prefix, offset))
    }

    fn list_with_delimiter<'a, 'b, 'f>(
        &'a self,
        prefix: Option<&'b Path>,
    ) -> BoxFuture<'f, Result<ListResult>>
    where
        'a: 'f,
        'b: 'f,
    {
        self.inner.list_with_delimiter(prefix)
    }

    fn copy<'a, 'b, 'c, 'f>(&'a self, from: &'b Path, to: &'c Path) -> BoxFuture<'f, Result<()>>
    where
        'a: 'f,
        'b: 'f,
        'c: 'f,
    {
        self.inner.copy(from, to)
    }

    fn copy_if_not_exists<'a, 'b, 'c, 'f>(&'a self, from: &'b Path, to: &'c Path) -> BoxFuture<'f, Result<()>>
    where
        'a: 'f,
        'b: 'f,
        'c: 'f,
    {
        self.inner.copy_if_not_exists(from, to)
    }
}
