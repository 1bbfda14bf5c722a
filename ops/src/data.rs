//! Data commands: `cat` and `stat`, through the fleet when one runs, else straight from the origin.

use std::io::Write;
use std::process::ExitCode;

use anyhow::{Context, Result};
use memarts_protocol::{ObjectMeta, ObjectUrl};
use memarts_proxy::origin::Origin;
use memarts_shim::{fleet_running, Client, ShimConfig};

use crate::cli::{Common, StatArgs, UrlArgs};
use crate::settings::resolve;

/// Bytes `cat` moves per step, so any object streams in bounded memory.
const WINDOW: usize = 16 << 20;

enum Access {
    Fleet(Client),
    Direct(Box<(Origin, tokio::runtime::Runtime)>),
}

fn access(common: &Common) -> Result<Access> {
    let cfg = resolve(common)?;
    if fleet_running(&cfg.run_dir) {
        let shim = ShimConfig { run_dir: cfg.run_dir.clone(), ..ShimConfig::from_env()? };
        return Ok(Access::Fleet(Client::new(shim)?));
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    Ok(Access::Direct(Box::new((Origin::from_env(cfg.origin), rt))))
}

fn parse(url: &str) -> Result<ObjectUrl> {
    ObjectUrl::parse(&memarts_shim::absolutize(url)?).map_err(anyhow::Error::msg)
}

impl Access {
    fn stat(&self, url: &str) -> Result<ObjectMeta> {
        match self {
            Access::Fleet(c) => Ok(c.stat(url)?),
            Access::Direct(d) => Ok(d.1.block_on(d.0.head(&parse(url)?))?),
        }
    }

    fn read_at(&self, url: &str, meta: &ObjectMeta, offset: u64, buf: &mut [u8]) -> Result<usize> {
        match self {
            Access::Fleet(c) => Ok(c.read_at_meta(url, meta, offset, buf)?),
            Access::Direct(d) => {
                let (o, rt) = (&d.0, &d.1);
                let end = (offset + buf.len() as u64).min(meta.size);
                let etag = meta.etag.as_deref().unwrap_or_default();
                let bytes = rt.block_on(o.get_range(&parse(url)?, offset..end, etag))?;
                buf[..bytes.len()].copy_from_slice(&bytes);
                Ok(bytes.len())
            }
        }
    }
}

pub fn cat(common: &Common, args: &UrlArgs) -> Result<ExitCode> {
    let access = access(common)?;
    let meta = access.stat(&args.url).with_context(|| args.url.clone())?;
    let mut buf = vec![0u8; WINDOW.min(meta.size as usize)];
    let mut out = std::io::stdout().lock();
    let mut offset = 0;
    while offset < meta.size {
        let n = access.read_at(&args.url, &meta, offset, &mut buf).with_context(|| args.url.clone())?;
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
