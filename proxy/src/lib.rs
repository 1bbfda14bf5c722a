//! The memarts proxy: one slot of a node's fleet. It owns everything heavy — origin clients and
//! credentials, the metadata cache, the chunk index and the SSD I/O engine — and serves shims over a
//! Unix socket.
//!
//! Layout, along the data path:
//! - [`server`]: bind, accept, peer-credential check, handshake, one task per connection, one
//!   handler per request kind, drain.
//! - [`engine`]: the slot's [`engine::Engine`]: metadata cache, chunk index (LRU within the slot's
//!   capacity share), single-flight fills from the origin, eviction, background index rebuild,
//!   uploads.
//! - [`cluster`]: the pool of several nodes' fleets: membership, ownership, peer reads.
//! - [`memarts_only`]: the store of memarts-only objects (`write_memarts`) and its on-disk format.
//! - [`chunk_store`]: the on-disk chunk format and the io_uring / pread engines behind one trait.
//! - [`origin`]: `object_store` access to S3-compatible endpoints and local files, with `If-Match`,
//!   request-sized deadlines and retries.
//! - [`cache_root`]: the cache dir checked at start-up (ours, private, no symlinks) before anything
//!   in it is read or removed.
//! - [`config`], [`lifecycle`]: configuration (the environment's part parsed by `memarts_settings`),
//!   run dir / pid lock / readiness.
//! - [`metrics`]: the node's Prometheus endpoint, served by one slot for the fleet.
//! - [`budget`]: the slot-wide cap on bytes held in memory for clients (upload payloads, fills).
//! - [`StartError`] (in `start_error.rs`): why a slot could not be built or started.
//!
//! [`build_engine`] builds a slot from a [`config::FleetConfig`] and [`serve`] serves it;
//! [`lifecycle::main`] is the whole life of a proxy process, which the `memarts-proxy` binary (in
//! the `memarts-ops` package, with the CLI that starts it) calls after parsing its arguments and
//! setting up logging. Tests can call [`server::run`] directly with their own origin.

pub mod budget;
pub mod cache_root;
pub mod chunk_store;
pub mod cluster;
pub mod config;
pub mod embedded;
pub mod engine;
pub mod lifecycle;
pub mod memarts_only;
pub mod metrics;
pub mod origin;
pub mod server;
pub mod siblings;
mod start_error;

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::chunk_store::{select_io_engine, ChunkStore};
use crate::config::FleetConfig;
use crate::engine::{Engine, MetaCache, SlotInfo};
use crate::origin::Origin;
use crate::server::ConnSettings;

pub use crate::start_error::{EmbeddedStep, StartError};

/// Entries the metadata cache of one slot holds at most.
const META_CACHE_ENTRIES: usize = 1 << 20;

/// Builds the engine of `slot` from the fleet config: I/O engine, chunk store, origin (credentials
/// from the credentials file or the environment). Returns the engine and a warning to surface (e.g.
/// the io_uring fallback reason).
pub fn build_engine(cfg: &FleetConfig, slot: u32) -> Result<(Arc<Engine>, Option<String>), StartError> {
    let origin = Origin::from_env(cfg.origin.clone())?;
    build_engine_with(cfg, slot, origin)
}

/// [`build_engine`] with a given origin (tests inject `InMemory` or fault-injecting stores).
pub fn build_engine_with(
    cfg: &FleetConfig,
    slot: u32,
    origin: Origin,
) -> Result<(Arc<Engine>, Option<String>), StartError> {
    let origin = if cfg.origin_log {
        let path = cfg.run_dir.join(format!("origin-{slot}.log"));
        origin
            .with_request_log(&path)
            .map_err(|source| StartError::RequestLog { path: path.clone(), source })?
    } else {
        origin
    };
    let kind = cfg.io_engine_kind()?;
    let (io, fallback) = select_io_engine(kind)
        .map_err(|source| StartError::IoEngine { io_engine: cfg.io_engine.clone(), source })?;
    let io_engine = io.name();
    let cache_dir = |source| StartError::CacheDir { path: cfg.cache_dir.clone(), source };
    // Checked before anything in it is read or removed (S9), here for every slot and embedded engine.
    let tree = cache_root::CacheRoot::open(&cfg.cache_dir)?;
    let store = ChunkStore::open_in(&tree, io).map_err(cache_dir)?;
    // Opened whatever `pack_max` says: chunks packed while it was set stay found (and their room
    // reclaimed) after it was unset.
    if !cfg.passthrough {
        let (slots, pack_max) = (cfg.slots, cfg.pack_max.unwrap_or(chunk_store::DEFAULT_PACK_MAX));
        let owns = |id| memarts_protocol::owner_slot(id, slots) == slot;
        match store.open_segments(&tree, (slot, slots), pack_max, owns) {
            Ok(true) => {}
            Ok(false) => tracing::info!(
                "another process writes slot {slot}'s segments: small chunks are kept as files"
            ),
            Err(e) => {
                tracing::warn!("small chunks are kept as files: cannot open slot {slot}'s segments: {e}")
            }
        }
    }
    let info = SlotInfo {
        slot,
        slots: cfg.slots,
        cache_dir: cfg.cache_dir.clone(),
        capacity: cfg.capacity,
        io_engine,
        passthrough: cfg.passthrough,
        memory_budget: cfg.memory_budget.unwrap_or(budget::DEFAULT_BYTES),
        eviction: cfg.eviction()?,
    };
    let only = if cfg.passthrough {
        None
    } else {
        Some(memarts_only::OnlyStore::open_in(&tree, cfg.memarts_only_capacity).map_err(cache_dir)?)
    };
    let engine = Engine::new(info, origin, store, MetaCache::new(cfg.meta_ttl(), META_CACHE_ENTRIES), only);
    engine.configure_prefetch(cfg.prefetch.clone());
    Ok((engine, fallback.map(|why| format!("using the pread engine: {why}"))))
}

/// Creates the slot's metadata table, from which shims of the fleet's uid read warm objects with no
/// round trip (`engine/local_reads.rs`), and the tables of its packed and resident chunks. Not where nothing is cached or the metadata is never trusted
/// (a TTL of 0: every read asks the origin). A table that cannot be made only costs the local hits.
pub fn publish_metadata(cfg: &FleetConfig, slot: u32, engine: &Arc<Engine>) {
    let ttl = cfg.meta_ttl();
    if cfg.passthrough || ttl.is_zero() {
        return;
    }
    let path = memarts_disk::layout::meta_table_path(&cfg.run_dir, slot);
    if let Err(e) = engine.metadata().cache().publish_at(path.clone()) {
        tracing::warn!("no local hits: cannot create {}: {e}", path.display());
        return;
    }
    let path = memarts_disk::layout::packed_table_path(&cfg.run_dir, slot);
    if let Err(e) = engine.disk().publish_packed(path.clone()) {
        tracing::warn!("packed chunks are read through the slot: cannot create {}: {e}", path.display());
    }
    let fleet = cfg.resident_memory.unwrap_or_else(engine::resident::default_fleet_budget);
    let budget = engine::resident::slot_budget(fleet, cfg.slots);
    if budget == 0 {
        return;
    }
    let path = memarts_disk::layout::resident_table_path(&cfg.run_dir, slot);
    if let Err(e) = engine.disk().publish_residents(&path, budget) {
        tracing::warn!(
            "no resident chunks (local reads check every byte): cannot create {}: {e}",
            path.display()
        );
    }
}

/// Connection settings of `slot` from the fleet config.
pub fn conn_settings(cfg: &FleetConfig, slot: u32) -> ConnSettings {
    ConnSettings {
        slot,
        slots: cfg.slots,
        allowed_uids: cfg.allowed_uids.clone(),
        local: server::LocalAccess::new(nix::unistd::getuid().as_raw(), &cfg.local_roots),
        idle_timeout: Duration::from_secs_f64(cfg.idle_timeout_secs),
        io_timeout: Duration::from_secs_f64(cfg.io_timeout_secs),
        spin: Duration::from_micros(cfg.spin_us),
        spinning: Default::default(),
    }
}

/// Serves a built engine on `listener` until `shutdown`; starts the background index rebuild (which
/// loads the last run's metadata) first.
pub async fn serve(
    cfg: &FleetConfig,
    slot: u32,
    engine: Arc<Engine>,
    listener: tokio::net::UnixListener,
    shutdown: CancellationToken,
) {
    engine.metadata().start_refresher();
    engine.start_rebuild();
    let drain = Duration::from_secs_f64(cfg.drain_timeout_secs);
    server::run(
        engine.clone(),
        conn_settings(cfg, slot),
        listener,
        cfg.max_connections as usize,
        Duration::from_secs_f64(cfg.drain_timeout_secs),
        shutdown,
    )
    .await;
    engine.wait_idle(drain).await;
    engine.metadata().save_meta_snapshot();
}
