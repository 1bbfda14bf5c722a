//! How a data command reaches objects: through the fleet when one runs (so it fills and uses the
//! cache), else straight from the origin.

use anyhow::Result;
use memarts_protocol::{ListEntry, ListRequest, ObjectMeta, ObjectUrl};
use memarts_proxy::origin::Origin;
use memarts_shim::{fleet_running, Client};

use crate::cli::Common;
use crate::settings::{resolve, shim_config};

pub enum Access {
    Fleet(Client),
    Direct(Box<(Origin, tokio::runtime::Runtime)>),
}

pub fn access(common: &Common) -> Result<Access> {
    let cfg = resolve(common)?;
    if fleet_running(&cfg.run_dir) {
        // An untrusted fleet is an error here, never a reason to go to the origin without it.
        return Ok(Access::Fleet(Client::new(shim_config(&cfg)?)?));
    }
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    Ok(Access::Direct(Box::new((Origin::from_env(cfg.origin)?, rt))))
}

fn parse(url: &str) -> Result<ObjectUrl> {
    ObjectUrl::parse(&memarts_shim::absolutize(url)?).map_err(anyhow::Error::msg)
}

impl Access {
    pub fn stat(&self, url: &str) -> Result<ObjectMeta> {
        match self {
            Access::Fleet(c) => Ok(c.stat(url)?),
            Access::Direct(d) => Ok(d.1.block_on(d.0.head(&parse(url)?))?),
        }
    }

    /// Bytes from `offset` into `buf`, pinned to `meta`'s version; short only at the end.
    pub fn read_at(&self, url: &str, meta: &ObjectMeta, offset: u64, buf: &mut [u8]) -> Result<usize> {
        match self {
            Access::Fleet(c) => Ok(c.read_at(url, meta, offset, buf)?),
            Access::Direct(d) => {
                let (o, rt) = (&d.0, &d.1);
                let end = (offset + buf.len() as u64).min(meta.size);
                if end <= offset {
                    return Ok(0);
                }
                let etag = meta.etag.as_deref().unwrap_or_default();
                let bytes = rt.block_on(o.get_range(&parse(url)?, offset..end, etag))?;
                buf[..bytes.len()].copy_from_slice(&bytes);
                Ok(bytes.len())
            }
        }
    }

    /// Writes the local file `path` as the new version of `url`.
    pub fn put_file(&self, url: &str, path: &std::path::Path) -> Result<u64> {
        match self {
            Access::Fleet(c) => Ok(c.put_file(url, path)?.size),
            Access::Direct(d) => {
                use std::io::Read;
                let mut file = std::fs::File::open(path)?;
                d.1.block_on(async {
                    let mut upload = d.0.start_upload(&parse(url)?, 8 << 20).await?;
                    let mut buf = vec![0u8; 8 << 20];
                    loop {
                        let n = file.read(&mut buf)?;
                        if n == 0 {
                            break;
                        }
                        upload.write(&buf[..n]).await?;
                    }
                    let size = upload.written();
                    upload.finish().await?;
                    Ok(size)
                })
            }
        }
    }

    /// Every entry under `url` (one level, or all objects below it with `recursive`).
    pub fn list(&self, url: &str, recursive: bool) -> Result<Vec<ListEntry>> {
        match self {
            Access::Fleet(c) => Ok(c.list(url, recursive)?),
            Access::Direct(d) => {
                let url = parse(url)?.to_string();
                let mut out = Vec::new();
                let mut start_after = None;
                loop {
                    let req = ListRequest { url: url.clone(), recursive, start_after, max_entries: 1000 };
                    let page = d.1.block_on(d.0.list(&req))?;
                    out.extend(page.entries);
                    match page.next {
                        Some(next) => start_after = Some(next),
                        None => return Ok(out),
                    }
                }
            }
        }
    }
}
