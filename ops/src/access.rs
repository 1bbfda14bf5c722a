//! How a data command reaches objects: memarts' mode resolution (`memarts_session`), the same
//! as the Python package's. Through the fleet when one runs (or with `USE_MEMARTS_PROXY=1`), so it
//! fills and uses the cache; with `USE_MEMARTS=1` and no fleet, through an engine in this process on
//! the cache dir; otherwise through a pass-through engine in this process, straight from the origin.
//! A fleet that runs but is not trusted is an error, never a reason to go to the origin without it.

use anyhow::Result;
use memarts_session::Session;
use memarts_settings::Settings;

use crate::cli::Common;
use crate::settings::{resolve, shim_config};

pub fn access(common: &Common) -> Result<Session> {
    let settings = Settings::from_env()?;
    let cfg = resolve(common)?;
    Ok(Session::open(&settings, shim_config(&settings, &cfg), cfg)?)
}

/// Puts `url` in front of an error about it, unless the message names it already (the proxy's do:
/// "s3://b/k: not found at the origin"), so that an error says a thing once.
pub trait AboutUrl<T> {
    fn about(self, url: &str) -> anyhow::Result<T>;
}

impl<T, E: std::error::Error + Send + Sync + 'static> AboutUrl<T> for Result<T, E> {
    fn about(self, url: &str) -> anyhow::Result<T> {
        // The proxy names an obs:// or oss:// object by its s3:// URL: the bucket and key are
        // what must not be said twice.
        let named = url.split_once("://").map_or(url, |(_, rest)| rest);
        self.map_err(|e| {
            if e.to_string().contains(named) {
                anyhow::Error::new(e)
            } else {
                anyhow::Error::new(e).context(url.to_string())
            }
        })
    }
}
