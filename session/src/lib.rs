//! How a client reaches memarts, resolved as MoXing does, for the Python package and the `memarts`
//! CLI alike. It lives apart from the shim so that a worker that only ever talks to a fleet links
//! the shim without the engine (`cargo tree -p memarts-shim` has no `memarts-proxy`):
//!
//! - **proxy**: a fleet answers in the run dir, or `USE_MEMARTS_PROXY=1`: talk to its slots. A fleet
//!   the client does not trust is an error (`Untrusted`), never a reason to go on without it.
//! - **embedded**: `USE_MEMARTS=1` and no fleet: one slot runs inside this process, on the shared
//!   cache dir, behind a private socket; the client talks to it exactly as to a fleet.
//! - **origin**: neither: the same in-process slot in pass-through (it reads the origin and caches
//!   nothing).
//!
//! The in-process slot does not survive a `fork`; a forked child opens its own [`Session`].

use memarts_proxy::config::FleetConfig;
use memarts_proxy::embedded::Embedded;
use memarts_settings::Settings;

use memarts_shim::config::ShimConfig;
use memarts_shim::error::{Error, Result};
use memarts_shim::{fleet_running, Client};

/// How a [`Session`] reaches memarts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The fleet's proxies.
    Proxy,
    /// The engine in this process, caching in the cache dir (`USE_MEMARTS=1`, no fleet).
    Embedded,
    /// No cache at all: every read from the origin (no fleet, `USE_MEMARTS` unset).
    Origin,
}

impl Mode {
    /// `"proxy"`, `"embedded"` or `"origin"`.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Proxy => "proxy",
            Mode::Embedded => "embedded",
            Mode::Origin => "origin",
        }
    }
}

/// A client in the mode the settings resolve to, and the in-process engine it talks to, if any.
pub struct Session {
    // Declared first, so dropped first: the connections close before the engine stops.
    client: Client,
    mode: Mode,
    _engine: Option<Embedded>,
}

impl Session {
    /// Resolves the mode from `settings` and whether a fleet runs in `shim.run_dir`, and connects.
    /// `fleet` configures the in-process engine of embedded and origin mode (its run dir is private
    /// and its own; in origin mode its cache dir too).
    pub fn open(settings: &Settings, shim: ShimConfig, fleet: FleetConfig) -> Result<Session> {
        let mode = if settings.use_memarts_proxy || fleet_running(&shim.run_dir) {
            Mode::Proxy
        } else if settings.use_memarts {
            Mode::Embedded
        } else {
            Mode::Origin
        };
        if mode == Mode::Proxy {
            return Ok(Session { client: Client::new(shim)?, mode, _engine: None });
        }
        let fleet = FleetConfig { passthrough: mode == Mode::Origin, ..fleet };
        let engine = Embedded::start(fleet)
            .map_err(|e| Error::Unavailable(format!("in-process memarts engine: {e}")))?;
        let client = Client::new(ShimConfig { run_dir: engine.run_dir().to_path_buf(), ..shim })?;
        Ok(Session { client, mode, _engine: Some(engine) })
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    pub fn client(&self) -> &Client {
        &self.client
    }
}

impl AsRef<Client> for Session {
    fn as_ref(&self) -> &Client {
        &self.client
    }
}

impl std::ops::Deref for Session {
    type Target = Client;

    fn deref(&self) -> &Client {
        &self.client
    }
}
