//! `memarts-bench-origin ROOT PORT ACCESS_KEY SECRET_KEY`: the origin of the link benchmarks
//! (`link_bench.py`, `cold_ab.py`), on 127.0.0.1:PORT.
//!
//! It is s3s-fs 0.14.1 (the same S3 implementation over a directory: auth, buckets, PUT, LIST, HEAD,
//! ETags, ranges, errors) with one change: a GET's body is read from its file in one piece (in pieces
//! of [`PIECE`] for larger ranges) on tokio's blocking pool, where s3s-fs streams it through a
//! `ReaderStream` of 4 KiB reads, each a round trip to that pool. On the benchmarks' 2-core VM, that
//! cost the stock server 0.7-1.4 ms of CPU and 80-95 context switches per 160 KiB object, half the
//! machine at the link's rate: CPU that no remote object store takes from a training node, and that
//! left every client (curl included) fighting the origin for cores. And a LIST without a delimiter
//! walks only the prefix's directory, in one blocking step (`list.rs`): s3s-fs walks the whole
//! bucket for every page. The stock server stays selectable (`BENCH_ORIGIN=s3s-fs`).

mod list;

use std::io;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder as ConnBuilder;
use s3s::auth::SimpleAuth;
use s3s::dto::*;
use s3s::service::S3ServiceBuilder;
use s3s::{S3Request, S3Response, S3Result, S3};
use s3s_fs::FileSystem;

/// Largest read of one step of a GET body.
const PIECE: u64 = 8 << 20;

struct Origin {
    fs: FileSystem,
    root: PathBuf,
}

/// The S3 operations: those the benchmarks use (and the usual housekeeping ones) forwarded to
/// s3s-fs, GETs to [`Origin::get_whole`], LISTs to [`Origin::list_v2`]. (`async_trait` must see
/// the methods as written here.)
macro_rules! s3_impl {
    ($($op:ident: $input:ty => $output:ty;)*) => {
        #[async_trait::async_trait]
        impl S3 for Origin {
            $(
                async fn $op(&self, req: S3Request<$input>) -> S3Result<S3Response<$output>> {
                    self.fs.$op(req).await
                }
            )*

            async fn get_object(
                &self,
                req: S3Request<GetObjectInput>,
            ) -> S3Result<S3Response<GetObjectOutput>> {
                self.get_whole(req).await
            }

            async fn list_objects_v2(
                &self,
                req: S3Request<ListObjectsV2Input>,
            ) -> S3Result<S3Response<ListObjectsV2Output>> {
                self.list_v2(req).await
            }
        }
    };
}

s3_impl! {
    create_bucket: CreateBucketInput => CreateBucketOutput;
    delete_bucket: DeleteBucketInput => DeleteBucketOutput;
    head_bucket: HeadBucketInput => HeadBucketOutput;
    list_buckets: ListBucketsInput => ListBucketsOutput;
    get_bucket_location: GetBucketLocationInput => GetBucketLocationOutput;
    put_object: PutObjectInput => PutObjectOutput;
    head_object: HeadObjectInput => HeadObjectOutput;
    delete_object: DeleteObjectInput => DeleteObjectOutput;
    delete_objects: DeleteObjectsInput => DeleteObjectsOutput;
    copy_object: CopyObjectInput => CopyObjectOutput;
    list_objects: ListObjectsInput => ListObjectsOutput;
    create_multipart_upload: CreateMultipartUploadInput => CreateMultipartUploadOutput;
    upload_part: UploadPartInput => UploadPartOutput;
    list_parts: ListPartsInput => ListPartsOutput;
    complete_multipart_upload: CompleteMultipartUploadInput => CompleteMultipartUploadOutput;
    abort_multipart_upload: AbortMultipartUploadInput => AbortMultipartUploadOutput;
}

impl Origin {
    /// A LIST of the prefix's directory in one blocking step ([`list::list_v2`]), or s3s-fs's
    /// where that hands it back.
    async fn list_v2(&self, req: S3Request<ListObjectsV2Input>) -> S3Result<S3Response<ListObjectsV2Output>> {
        let root = self.root.clone();
        let (req, page) = tokio::task::spawn_blocking(move || {
            let page = list::list_v2(&root, &req);
            (req, page)
        })
        .await
        .map_err(|e| io_error(io::Error::other(e)))?;
        match page {
            Some(page) => page,
            None => self.fs.list_objects_v2(req).await,
        }
    }

    /// s3s-fs's GET with its body read in one piece (see the module docs).
    async fn get_whole(&self, req: S3Request<GetObjectInput>) -> S3Result<S3Response<GetObjectOutput>> {
        // s3s-fs checks the names, the range and any condition, and answers with the headers; only
        // its body (a lazy stream: nothing read yet) is replaced.
        let path = self.root.join(&req.input.bucket).join(&req.input.key);
        let range = req.input.range;
        let mut res = self.fs.get_object(req).await?;
        let len = res.output.content_length.unwrap_or(0).max(0) as u64;
        // The file opened and its size taken in one step off the runtime.
        let (file, size) = tokio::task::spawn_blocking(move || {
            let file = std::fs::File::open(&path)?;
            let size = file.metadata()?.len();
            Ok::<_, io::Error>((Arc::new(file), size))
        })
        .await
        .unwrap_or_else(|e| Err(io::Error::other(e)))
        .map_err(io_error)?;
        let start = match range {
            None => 0,
            Some(r) => r.check(size).map_err(|_| s3s::s3_error!(InvalidRange))?.start,
        };
        let pieces = futures::stream::unfold(start, move |at| {
            let file = file.clone();
            async move {
                let end = start + len;
                if at >= end {
                    return None;
                }
                let n = (end - at).min(PIECE) as usize;
                let read = tokio::task::spawn_blocking(move || {
                    let mut buf = vec![0u8; n];
                    file.read_exact_at(&mut buf, at).map(|()| Bytes::from(buf))
                })
                .await
                .unwrap_or_else(|e| Err(io::Error::other(e)));
                Some((read, at + n as u64))
            }
        });
        res.output.body = Some(StreamingBlob::wrap(pieces));
        Ok(res)
    }
}

fn io_error(e: io::Error) -> s3s::S3Error {
    s3s::S3Error::with_message(s3s::S3ErrorCode::InternalError, e.to_string())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [root, port, access_key, secret_key] = args.as_slice() else {
        eprintln!("usage: memarts-bench-origin ROOT PORT ACCESS_KEY SECRET_KEY");
        std::process::exit(2);
    };
    let root = PathBuf::from(root);
    let fs = FileSystem::new(&root).map_err(|e| format!("{}: {e:?}", root.display()))?;
    let origin = Origin { fs, root };
    let service = {
        let mut b = S3ServiceBuilder::new(origin);
        b.set_auth(SimpleAuth::from_single(access_key.as_str(), secret_key.as_str()));
        b.build()
    };
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port.parse::<u16>()?)).await?;
    let http = ConnBuilder::new(TokioExecutor::new());
    loop {
        let (socket, _) = listener.accept().await?;
        let conn = http.serve_connection(TokioIo::new(socket), service.clone()).into_owned();
        tokio::spawn(async move {
            let _ = conn.await;
        });
    }
}
