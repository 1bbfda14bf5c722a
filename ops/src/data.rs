//! Data commands: `cat` and `stat`, through the fleet when one runs, else straight from the origin
//! (see `access.rs`).

use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Result;
use memarts_shim::Stream;

use crate::access::{access, AboutUrl};
use crate::cli::{Common, StatArgs, UrlArgs};

/// Bytes `cat` hands to stdout per write; the stream keeps its read-ahead window in flight
/// meanwhile, so memory stays bounded by that window plus this buffer.
const WRITE: usize = 1 << 20;

pub fn cat(common: &Common, args: &UrlArgs) -> Result<ExitCode> {
    let access = Arc::new(access(common)?);
    let mut stream = Stream::open(access, &args.url).about(&args.url)?;
    let size = stream.size();
    let mut buf = vec![0u8; WRITE.min(size as usize)];
    let mut out = std::io::stdout().lock();
    while stream.position() < size {
        let n = stream.read(&mut buf[..]).about(&args.url)?;
        if n == 0 {
            anyhow::bail!("{}: object ended at {} of {size} bytes", args.url, stream.position());
        }
        match out.write_all(&buf[..n]) {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(ExitCode::SUCCESS),
            r => r?,
        }
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

pub fn stat(common: &Common, args: &StatArgs) -> Result<ExitCode> {
    let meta = access(common)?.stat(&args.url).about(&args.url)?;
    if args.json {
        let v = serde_json::json!({
            "url": args.url, "size": meta.size, "etag": meta.etag, "version": meta.version,
            "last_modified_ms": meta.last_modified_ms,
        });
        println!("{v}");
    } else {
        println!("url:           {}", args.url);
        println!("size:          {}", meta.size);
        println!("etag:          {}", meta.etag.as_deref().unwrap_or("-"));
        println!("last modified: {} ms since epoch", meta.last_modified_ms);
    }
    Ok(ExitCode::SUCCESS)
}
