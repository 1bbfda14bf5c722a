//! Data commands: `cat` and `stat`, through the fleet when one runs, else straight from the origin
//! (see `access.rs`).

use std::io::Write;
use std::process::ExitCode;

use anyhow::{Context, Result};

use crate::access::access;
use crate::cli::{Common, StatArgs, UrlArgs};

/// Bytes `cat` moves per step, so any object streams in bounded memory.
const WINDOW: usize = 16 << 20;

pub fn cat(common: &Common, args: &UrlArgs) -> Result<ExitCode> {
    let access = access(common)?;
    let meta = access.stat(&args.url).with_context(|| args.url.clone())?;
    let mut buf = vec![0u8; WINDOW.min(meta.size as usize)];
    let mut out = std::io::stdout().lock();
    let mut offset = 0;
    while offset < meta.size {
        let n = access.read_at(&args.url, &meta, offset, &mut buf[..]).with_context(|| args.url.clone())?;
        if n == 0 {
            anyhow::bail!("{}: object ended at {offset} of {} bytes", args.url, meta.size);
        }
        match out.write_all(&buf[..n]) {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(ExitCode::SUCCESS),
            r => r?,
        }
        offset += n as u64;
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

pub fn stat(common: &Common, args: &StatArgs) -> Result<ExitCode> {
    let meta = access(common)?.stat(&args.url).with_context(|| args.url.clone())?;
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
