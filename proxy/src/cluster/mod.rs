//! The cluster pool: the fleets of several nodes form one cache. A chunk has one owning node
//! (rendezvous hashing over the *registered* members, weighted), and inside it the owning slot as on
//! one node; a miss on another node is read from the owner over authenticated TCP, so a chunk leaves
//! the object store once per cluster and the pool holds the sum of the nodes' capacity. A node that
//! does not answer is routed around (the next owner, or the origin); ownership never follows
//! liveness, so a node that comes back owns, and serves, the same chunks again.
//!
//! - `config.rs`: this node's settings and the shared cluster file, checked ([`config::Plan`]).
//! - `members.rs`: who is in the cluster ([`Member`], [`Roster`]).
//! - `ring.rs`: which node owns a chunk, and who takes over.
//! - `liveness.rs`: which members reads go to now (alive, suspect, down).
//! - `auth.rs`: the handshake over the cluster secret (Noise, pre-shared key); `sealed.rs`: every
//!   frame after it, encrypted and authenticated in order.
//! - `peer_client.rs`: reads from other nodes, checked; `peer_server.rs`: this slot's listener.
//! - `roster_snapshot.rs`: the last known roster on disk ([`save_snapshot`], [`load_snapshot`],
//!   [`keep_saving`]), to start from when etcd is unreachable.
//! - `etcd.rs` (feature `etcd`): membership from etcd for elastic jobs (`EtcdMembership`): its
//!   key layout, join and leave, reconnection; `etcd_session.rs` one connection's lease renewals and
//!   watch; `etcd_keys.rs` the keys and the roster read from them; `etcd_tests.rs` its tests
//!   against a real etcd.
//!
//! The engine asks [`Cluster::owners`] where a chunk is, and reads from a peer or the origin
//! (`engine/peers.rs`).

pub mod auth;
pub mod config;
#[cfg(feature = "etcd")]
pub mod etcd;
#[cfg(feature = "etcd")]
mod etcd_keys;
#[cfg(feature = "etcd")]
mod etcd_session;
#[cfg(all(test, feature = "etcd"))]
mod etcd_tests;
mod liveness;
pub mod members;
pub mod peer_client;
pub mod peer_server;
mod ring;
pub mod roster_snapshot;
pub mod sealed;

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::UNIX_EPOCH;

use memarts_protocol::peer::MemberStatus;
use tokio::sync::watch;

pub use config::{ClusterError, ClusterSettings, Plan};
#[cfg(feature = "etcd")]
pub use etcd::{EtcdError, EtcdMembership};
pub use members::{Member, Roster};
pub use roster_snapshot::{keep_saving, load_snapshot, save_snapshot};

use liveness::Liveness;
use peer_client::PeerClient;

/// A slot's cluster counters (`memarts cluster status`).
#[derive(Debug, Default)]
pub struct ClusterStats {
    pub peer_reads: AtomicU64,
    pub bytes_from_peers: AtomicU64,
    pub peer_errors: AtomicU64,
    pub fallbacks: AtomicU64,
    pub served_chunks: AtomicU64,
    pub served_bytes: AtomicU64,
    pub refused_connections: AtomicU64,
    /// Members' requests refused: anything but an object-store URL (S7).
    pub refused_requests: AtomicU64,
    /// Connections this listener ended on a record that failed to open (S8); the client side
    /// counts its own in [`PeerClient::forged`].
    pub forged_frames: AtomicU64,
}

/// A warning that is logged at most once per [`LogLimit::EVERY`], saying how many were not.
#[derive(Default)]
pub struct LogLimit {
    last: std::sync::Mutex<Option<std::time::Instant>>,
    suppressed: AtomicU64,
}

impl LogLimit {
    pub const EVERY: std::time::Duration = std::time::Duration::from_secs(10);

    /// Calls `log` with the number of warnings not logged since the last one, unless one was
    /// logged within [`LogLimit::EVERY`].
    pub fn note(&self, log: impl FnOnce(u64)) {
        use std::sync::atomic::Ordering;
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_some_and(|t| t.elapsed() < Self::EVERY) {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            return;
        }
        *last = Some(std::time::Instant::now());
        log(self.suppressed.swap(0, Ordering::Relaxed));
    }
}

/// One slot's part of the cluster: the plan it joined with, the roster, the liveness of the members,
/// and its pool of connections to them.
pub struct Cluster {
    pub plan: Plan,
    pub slot: u32,
    pub slots: u32,
    roster: watch::Receiver<Roster>,
    liveness: Liveness,
    pub peers: PeerClient,
    pub stats: ClusterStats,
    /// Warnings of members' refused requests.
    pub refusals: LogLimit,
    /// Keeps the membership (the etcd session) alive as long as the slot.
    _membership: Keep,
}

type Keep = Option<Box<dyn std::any::Any + Send + Sync>>;

/// The roster from etcd: joined now, or (with `start_from_last_known` and etcd unreachable) the
/// roster saved at `snapshot` while joining goes on in the background. The roster this slot routes
/// by is its own channel, fed by the membership once it is joined.
#[cfg(feature = "etcd")]
async fn join_etcd(
    plan: &Plan,
    endpoints: &[String],
    name: &str,
    start_from_last_known: bool,
    snapshot: std::path::PathBuf,
    slot: u32,
) -> Result<(watch::Receiver<Roster>, Keep), JoinError> {
    let timeout = plan.connect_timeout.max(std::time::Duration::from_secs(5));
    let joined = EtcdMembership::join(endpoints, name, &plan.me, slot, plan.lease_ttl, timeout).await;
    let (first, membership) = match joined {
        Ok(m) => (m.roster().borrow().clone(), Some(m)),
        Err(e) if e.retryable() && start_from_last_known => {
            let last = load_snapshot(&snapshot).map_err(|source| {
                JoinError::Etcd(format!(
                    "{e}; and no last known membership in {}: {source}",
                    snapshot.display()
                ))
            })?;
            tracing::warn!(
                "{e}: starting from the last known membership ({}), joining in the background",
                snapshot.display()
            );
            (last, None)
        }
        Err(e) => return Err(JoinError::Etcd(e.to_string())),
    };
    if let Some(dir) = snapshot.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let (tx, rx) = watch::channel(first);
    let (plan, endpoints, name) = (plan.clone(), endpoints.to_vec(), name.to_string());
    let task = tokio::spawn(async move {
        let mut membership = membership;
        loop {
            let m = match membership.take() {
                Some(m) => m,
                None => {
                    match EtcdMembership::join(&endpoints, &name, &plan.me, slot, plan.lease_ttl, timeout)
                        .await
                    {
                        Ok(m) => m,
                        Err(_) => {
                            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                            continue;
                        }
                    }
                }
            };
            m.save_snapshots_to(&snapshot);
            let mut roster = m.roster();
            loop {
                let _ = tx.send(roster.borrow_and_update().clone());
                if roster.changed().await.is_err() {
                    break;
                }
            }
        }
    });
    let keep: Box<dyn std::any::Any + Send + Sync> = Box::new(AbortOnDrop(task));
    Ok((rx, Some(keep)))
}

#[cfg(not(feature = "etcd"))]
async fn join_etcd(
    _: &Plan,
    _: &[String],
    _: &str,
    _: bool,
    _: std::path::PathBuf,
    _: u32,
) -> Result<(watch::Receiver<Roster>, Keep), JoinError> {
    Err(JoinError::Etcd("this build has no etcd membership (cargo feature `etcd`)".into()))
}

/// Ends the membership task (and so the etcd session it holds) with the slot.
#[cfg(feature = "etcd")]
struct AbortOnDrop(tokio::task::JoinHandle<()>);

#[cfg(feature = "etcd")]
impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Asks the suspect members whose back-off has passed whether they answer again (a handshake and a
/// status request), until the cluster is dropped.
async fn probe_suspects(cluster: std::sync::Weak<Cluster>) {
    loop {
        let Some(c) = cluster.upgrade() else { return };
        let pause =
            c.plan.suspect.clamp(std::time::Duration::from_millis(100), std::time::Duration::from_secs(5));
        for id in c.liveness.due() {
            let Some(member) = c.roster().member(&id).cloned() else { continue };
            match c.peers.status(&member, 0).await {
                Ok(_) => c.liveness.succeeded(&id),
                Err(_) => c.liveness.failed(&id),
            }
        }
        drop(c);
        tokio::time::sleep(pause).await;
    }
}

/// Why a slot could not join its cluster.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    #[error(transparent)]
    Config(#[from] ClusterError),
    #[error("etcd membership: {0}")]
    Etcd(String),
}

/// Joins the cluster `settings` name as `slot` of `slots` and binds the slot's peer listener
/// (`host:port + slot` of this node's listen address, by default its peer address).
pub async fn start(
    settings: &ClusterSettings,
    slot: u32,
    slots: u32,
    cache_dir: &std::path::Path,
) -> Result<(Arc<Cluster>, tokio::net::TcpListener), crate::StartError> {
    let plan = settings.resolve(slots).map_err(JoinError::from)?;
    let address = peer_client::slot_address(&plan.listen, slot).map_err(|why| {
        crate::StartError::PeerListener { address: plan.listen.clone(), source: std::io::Error::other(why) }
    })?;
    let listener = tokio::net::TcpListener::bind(&address)
        .await
        .map_err(|source| crate::StartError::PeerListener { address: address.clone(), source })?;
    let cluster = Cluster::join(plan, slot, slots, &cache_dir.join("v1/cluster")).await?;
    tracing::info!(node = cluster.me(), %address, "slot joined the cluster, serving peers");
    Ok((cluster, listener))
}

impl Cluster {
    /// Joins with `plan` as `slot` of `slots`; `state_dir` keeps the last roster etcd gave.
    pub async fn join(
        plan: Plan,
        slot: u32,
        slots: u32,
        state_dir: &std::path::Path,
    ) -> Result<Arc<Cluster>, JoinError> {
        let (roster, membership) = match &plan.membership {
            config::Membership::Static(members) => {
                let (tx, rx) = watch::channel(Roster::all_alive(members.clone()));
                // Nothing ever changes a static roster; the sender lives as long as the receiver needs.
                let keep: Box<dyn std::any::Any + Send + Sync> = Box::new(tx);
                (rx, Some(keep))
            }
            config::Membership::Etcd { endpoints, name, start_from_last_known } => {
                let snapshot = state_dir.join(format!("{name}.roster.json"));
                join_etcd(&plan, endpoints, name, *start_from_last_known, snapshot, slot).await?
            }
        };
        let peers =
            PeerClient::new(&plan.me.id, plan.secret.clone(), plan.connect_timeout, plan.peer_timeout);
        let cluster = Arc::new(Cluster {
            liveness: Liveness::new(plan.suspect),
            peers,
            plan,
            slot,
            slots,
            roster,
            stats: ClusterStats::default(),
            refusals: LogLimit::default(),
            _membership: membership,
        });
        tokio::spawn(probe_suspects(Arc::downgrade(&cluster)));
        Ok(cluster)
    }

    /// The roster now.
    pub fn roster(&self) -> Roster {
        self.roster.borrow().clone()
    }

    pub fn me(&self) -> &str {
        &self.plan.me.id
    }

    /// The members a chunk of `placement` may be read from now, in order: its owner first, then the
    /// next owners, skipping those the membership says are down and those that failed recently. This
    /// node is always in it (a chunk whose turn comes to us is read from the origin here).
    pub fn owners(&self, placement: u64) -> Vec<Member> {
        let roster = self.roster.borrow();
        ring::owners(&roster.registered, placement)
            .into_iter()
            .filter(|m| {
                m.id == self.plan.me.id || (roster.alive.contains(&m.id) && self.liveness.usable(&m.id))
            })
            .cloned()
            .collect()
    }

    /// The registered owner of `placement`, whatever its liveness.
    pub fn owner(&self, placement: u64) -> Option<Member> {
        let roster = self.roster.borrow();
        ring::owners(&roster.registered, placement).first().map(|m| (*m).clone())
    }

    pub fn failed(&self, id: &str) {
        self.liveness.failed(id);
    }

    pub fn succeeded(&self, id: &str) {
        self.liveness.succeeded(id);
    }

    /// Every registered member and its state, as this slot sees it.
    pub fn members(&self) -> Vec<MemberStatus> {
        let roster = self.roster.borrow();
        roster
            .registered
            .iter()
            .map(|m| {
                let up = m.id == self.plan.me.id || roster.alive.contains(&m.id);
                let (state, since) = if m.id == self.plan.me.id {
                    (memarts_protocol::peer::MemberState::Alive, UNIX_EPOCH)
                } else {
                    self.liveness.state(&m.id, up)
                };
                MemberStatus {
                    id: m.id.clone(),
                    address: m.address.clone(),
                    weight: m.weight,
                    state,
                    since_ms: since.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64),
                }
            })
            .collect()
    }
}
