//! Data commands: `cat` and `stat`, through the fleet when one runs, else straight from the origin
//! (see `access.rs`).

use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Result;
use memarts_shim::Stream;

use crate::access::{access, AboutUrl};
use crate::cli::{Common, StatArgs, UrlArgs};

/// `memarts cat URL`: the object to stdout, through a stream (read-ahead window; warm chunks read
/// straight from their files), each chunk handed to stdout as it is, so memory stays bounded by the
/// window.
pub fn cat(common: &Common, args: &UrlArgs) -> Result<ExitCode> {
    let mut stream = Stream::open(Arc::new(access(common)?), &args.url).about(&args.url)?;
    let size = stream.size();
    let mut out = std::io::stdout().lock();
    widen_pipe(&out);
    // Straight from the fetched chunks to the output: no copy through a buffer of ours.
    let copied = stream.copy_to(|piece| out.write_all(piece));
    match copied {
        Err(memarts_shim::Error::Io(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => {
            return Ok(ExitCode::SUCCESS);
        }
        Err(e) => return Err(e).about(&args.url),
        Ok(n) if n < size => anyhow::bail!("{}: object ended at {n} of {size} bytes", args.url),
        Ok(_) => {}
    }
    match out.flush() {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        r => r?,
    }
    Ok(ExitCode::SUCCESS)
}

/// Pipe capacity `cat` asks for: a chunk of the default size (also Linux's default
/// `/proc/sys/fs/pipe-max-size`, the most an unprivileged process may ask for).
const PIPE_BYTES: i32 = 1 << 20;

/// When `out` is a pipe smaller than [`PIPE_BYTES`], makes it that large: a 64 KiB pipe (the
/// default) hands a chunk over in sixteen sleeps and wake-ups of both ends, and `memarts cat | tool`
/// is how the object usually leaves. Best effort: a refusal (the user's pipe pages over
/// `pipe-user-pages-soft`, a smaller `pipe-max-size`) leaves the pipe as it was.
fn widen_pipe(out: &impl std::os::fd::AsFd) {
    use nix::fcntl::{fcntl, FcntlArg};
    // Not a pipe: F_GETPIPE_SZ fails, and nothing is changed.
    if fcntl(out, FcntlArg::F_GETPIPE_SZ).is_ok_and(|size| size < PIPE_BYTES) {
        let _ = fcntl(out, FcntlArg::F_SETPIPE_SZ(PIPE_BYTES));
    }
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
