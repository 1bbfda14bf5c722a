//! Membership from etcd, for elastic jobs: each slot of a node registers the node, keeps a leased
//! "alive" key for itself and watches the others' keys; [`EtcdMembership::roster`] follows them.
//!
//! Key layout, for cluster `<name>` (node ids and the name are one path component each: non-empty,
//! no `/`):
//! - `/memarts/<name>/registered/<node id>` → the JSON of [`Member`], with no lease. Ownership is
//!   computed over the registered members, so a blip or a restart moves nothing (CLUSTER.md;
//!   Alluxio PR #18183). A node that joins again with another address overwrites its key: identity
//!   is the id, not the address (Alluxio PR #18437). Nothing here deletes a registration; taking a
//!   node out of the cluster for good is an operator's `etcdctl del`.
//! - `/memarts/<name>/alive/<node id>/<slot>` → empty, attached to that slot's lease. A node is
//!   alive while at least one of its slots' alive keys exists.
//!
//! Life of a membership: [`EtcdMembership::join`] connects, puts the registration, grants a lease of
//! `lease_ttl`, puts the alive key on it, lists the prefix and watches it from the revision after
//! the listing, all within `connect_timeout`. A background task then renews the lease every third
//! of its granted TTL and applies watch events. When etcd stops answering (a renewal unanswered
//! for a period, a stream error, the lease found expired, the watch canceled), the task keeps the
//! last roster as it was, so an etcd hiccup reshuffles and drops nothing (Alluxio PR #18554), and
//! retries with capped, jittered backoff: a new connection, the registration put again, a new
//! lease with the alive key put on it *before* the old lease is revoked (so the key never
//! vanishes), and a fresh listing (the whole truth, whatever events were missed) watched from the
//! revision after it. [`EtcdMembership::leave`] revokes the lease; dropping the membership without
//! it stops the renewals, and the slot counts as alive until its lease expires.
//!
//! With [`EtcdMembership::save_snapshots_to`] every roster change is saved to a file, so a slot
//! that finds etcd unreachable at start can begin from [`load_snapshot`](super::load_snapshot).

use std::path::Path;
use std::time::Duration;

use etcd_client::Client;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::etcd_keys::{valid_component, Keys, RosterState};
use super::etcd_session::{establish, publish, serve, Failure, Session};
use super::members::{Member, Roster};
use super::roster_snapshot::keep_saving;

/// Why joining an etcd membership failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EtcdError {
    #[error("etcd membership: no etcd endpoint given: list the cluster's etcd endpoints (host:port)")]
    NoEndpoints,
    #[error(
        "etcd membership: {what} {value:?} cannot be part of an etcd key: use a non-empty name \
         without '/' or control characters"
    )]
    InvalidName { what: &'static str, value: String },
    #[error("etcd membership: node {id:?} has weight {weight}: give a finite weight >= 0")]
    InvalidWeight { id: String, weight: f64 },
    #[error("etcd membership: the endpoints {endpoints} are not usable ({source}): give host:port or http://host:port")]
    BadEndpoint { endpoints: String, source: etcd_client::Error },
    #[error(
        "etcd at {endpoints} did not answer within {timeout:?} (last: {last}): check that etcd runs \
         there and that the endpoints are right, or start from the last known membership (load_snapshot)"
    )]
    Unreachable { endpoints: String, timeout: Duration, last: String },
    #[error("etcd at {endpoints} refused to {step} ({source}): check the permissions and quota of the cluster's etcd")]
    Refused { endpoints: String, step: &'static str, source: etcd_client::Error },
}

impl EtcdError {
    /// Whether trying again later may succeed (etcd was away), as opposed to a configuration or
    /// permission problem that a retry will not fix.
    pub fn retryable(&self) -> bool {
        matches!(self, EtcdError::Unreachable { .. })
    }
}

/// What a running membership needs to (re)join.
#[derive(Debug)]
pub(crate) struct JoinSpec {
    pub(crate) endpoints: Vec<String>,
    /// The endpoints as they appear in messages.
    pub(crate) shown: String,
    pub(crate) keys: Keys,
    pub(crate) me: Member,
    pub(crate) slot: u32,
    pub(crate) lease_ttl: Duration,
    pub(crate) connect_timeout: Duration,
}

/// This slot's membership of an etcd cluster; see the module comment.
#[derive(Debug)]
pub struct EtcdMembership {
    roster: watch::Receiver<Roster>,
    stop: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl EtcdMembership {
    /// Joins cluster `name` at `endpoints` as slot `slot` of node `me`: registers `me` (a permanent
    /// key), keeps a leased "alive" key for this slot, and watches the others. Fails (typed) if
    /// etcd cannot be reached within `connect_timeout`. The lease's TTL is `lease_ttl` rounded up to
    /// whole seconds (etcd may raise it to its minimum); a few seconds keeps an etcd hiccup from
    /// counting as a failure.
    pub async fn join(
        endpoints: &[String],
        name: &str,
        me: &Member,
        slot: u32,
        lease_ttl: Duration,
        connect_timeout: Duration,
    ) -> Result<EtcdMembership, EtcdError> {
        if endpoints.is_empty() {
            return Err(EtcdError::NoEndpoints);
        }
        for (what, value) in [("cluster name", name), ("node id", me.id.as_str())] {
            if !valid_component(value) {
                return Err(EtcdError::InvalidName { what, value: value.to_owned() });
            }
        }
        if !me.weight.is_finite() || me.weight < 0.0 {
            return Err(EtcdError::InvalidWeight { id: me.id.clone(), weight: me.weight });
        }
        let spec = JoinSpec {
            endpoints: endpoints.to_vec(),
            shown: endpoints.join(","),
            keys: Keys::new(name),
            me: me.clone(),
            slot,
            lease_ttl,
            connect_timeout,
        };
        let mut state = RosterState::new(spec.keys.clone());
        let session = first_session(&spec, &mut state).await?;
        let (tx, rx) = watch::channel(state.roster());
        let stop = CancellationToken::new();
        let task = tokio::spawn(run(spec, session, state, tx, stop.clone()));
        Ok(EtcdMembership { roster: rx, stop, task: Some(task) })
    }

    /// Saves the roster to `path` now and whenever it changes, for a later start while etcd is
    /// unreachable (see [`keep_saving`]); call it right after [`join`](Self::join). The saving
    /// ends with the membership.
    pub fn save_snapshots_to(&self, path: &Path) {
        keep_saving(self.roster(), path.to_path_buf());
    }

    /// The current roster, updated as members register, come alive or lose their lease. While etcd
    /// is unreachable it stays as last seen.
    pub fn roster(&self) -> watch::Receiver<Roster> {
        self.roster.clone()
    }

    /// Revokes this slot's lease (the node counts as down once all its slots left). The
    /// registration stays. Waits at most `connect_timeout` for etcd; if it is unreachable, the
    /// lease expires by itself after its TTL.
    pub async fn leave(mut self) {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for EtcdMembership {
    /// Without [`leave`](Self::leave): the renewals stop and the lease runs out (as if the process
    /// had died).
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// Tries to establish a session until `connect_timeout` has passed since the call.
async fn first_session(spec: &JoinSpec, state: &mut RosterState) -> Result<Session, EtcdError> {
    let deadline = tokio::time::Instant::now() + spec.connect_timeout;
    let unreachable = |last: String| EtcdError::Unreachable {
        endpoints: spec.shown.clone(),
        timeout: spec.connect_timeout,
        last,
    };
    let mut last = String::from("no answer");
    loop {
        match tokio::time::timeout_at(deadline, establish(spec, None, state)).await {
            Err(_) => return Err(unreachable(last)),
            Ok(Ok(session)) => return Ok(session),
            Ok(Err(failure)) if !failure.retryable() => return Err(failure.into_error(&spec.shown)),
            Ok(Err(failure)) => last = failure.to_string(),
        }
        tokio::time::sleep_until((tokio::time::Instant::now() + Duration::from_millis(100)).min(deadline))
            .await;
        if tokio::time::Instant::now() >= deadline {
            return Err(unreachable(last));
        }
    }
}

/// The background task: serve the session; when it is lost, keep the roster and reconnect.
async fn run(
    spec: JoinSpec,
    mut session: Session,
    mut state: RosterState,
    tx: watch::Sender<Roster>,
    stop: CancellationToken,
) {
    loop {
        let lost = tokio::select! {
            _ = stop.cancelled() => break,
            lost = serve(&mut session, &mut state, &tx) => lost,
        };
        tracing::warn!(
            endpoints = %spec.shown, node = %spec.me.id, slot = spec.slot,
            "etcd membership lost its session ({lost}): keeping the last roster, reconnecting"
        );
        let old_lease = session.lease;
        drop(session); // its streams: nothing reads them any more
        match reconnect(&spec, old_lease, &mut state, &stop).await {
            Some(fresh) => session = fresh,
            None => {
                // Left while etcd was away: one bounded try to revoke, else the lease runs out.
                if let Ok(client) = Client::connect(&spec.endpoints, None).await {
                    revoke(&spec, client, old_lease).await;
                }
                return;
            }
        }
        publish(&state, &tx);
        tracing::info!(endpoints = %spec.shown, node = %spec.me.id, slot = spec.slot, "etcd membership is back");
    }
    revoke(&spec, session.client, session.lease).await;
}

/// Retries [`establish`] with capped, jittered backoff until it succeeds (`Some`) or `stop` fires.
async fn reconnect(
    spec: &JoinSpec,
    old_lease: i64,
    state: &mut RosterState,
    stop: &CancellationToken,
) -> Option<Session> {
    // Never wait longer than a third of the TTL between tries: the lease must be renewed in time.
    let cap = (spec.lease_ttl / 3).clamp(Duration::from_millis(200), Duration::from_secs(2));
    let mut delay = Duration::from_millis(100);
    let mut attempts = 0u64;
    loop {
        let jittered = delay.mul_f64(0.5 + rand::random::<f64>() / 2.0);
        tokio::select! {
            _ = stop.cancelled() => return None,
            _ = tokio::time::sleep(jittered) => {}
        }
        let attempt = tokio::time::timeout(spec.connect_timeout, establish(spec, Some(old_lease), state));
        let outcome = tokio::select! {
            _ = stop.cancelled() => return None,
            outcome = attempt => outcome,
        };
        attempts += 1;
        let why = match outcome {
            Ok(Ok(session)) => return Some(session),
            Ok(Err(failure)) => failure.to_string(),
            Err(_) => format!("no answer within {:?}", spec.connect_timeout),
        };
        // The first failure says why; then one line every 30 tries (20 s to a minute), not one per try.
        if attempts == 1 || attempts.is_multiple_of(30) {
            tracing::warn!(endpoints = %spec.shown, attempts, "etcd membership cannot reconnect yet: {why}");
        }
        delay = (delay * 2).min(cap);
    }
}

async fn revoke(spec: &JoinSpec, mut client: Client, lease: i64) {
    match tokio::time::timeout(spec.connect_timeout, client.lease_revoke(lease)).await {
        Ok(Ok(_)) => {}
        outcome => {
            let why = match outcome {
                Ok(Err(e)) => e.to_string(),
                _ => "no answer".into(),
            };
            tracing::warn!(
                endpoints = %spec.shown, node = %spec.me.id, slot = spec.slot,
                "etcd membership could not revoke its lease ({why}): it expires after its TTL"
            );
        }
    }
}

impl Failure {
    fn into_error(self, endpoints: &str) -> EtcdError {
        let endpoints = endpoints.to_owned();
        match self.step {
            "connect" => EtcdError::BadEndpoint { endpoints, source: self.error },
            step => EtcdError::Refused { endpoints, step, source: self.error },
        }
    }
}
