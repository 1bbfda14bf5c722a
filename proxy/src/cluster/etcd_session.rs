//! One connection's worth of the etcd membership (see `etcd.rs`): [`establish`] registers the node,
//! puts this slot's alive key on a new lease and lists then watches the cluster's keys; [`serve`]
//! renews the lease and applies watch events until something is lost.

use std::time::Duration;

use etcd_client::{
    Client, ConnectOptions, GetOptions, LeaseKeepAliveStream, LeaseKeeper, PutOptions, WatchOptions,
    WatchStream,
};
use tokio::sync::watch;
use tokio::time::MissedTickBehavior;

use super::etcd::JoinSpec;
use super::etcd_keys::RosterState;
use super::members::Roster;

/// A live connection: the lease this slot's alive key is on, its renewals, and the watch.
pub(crate) struct Session {
    pub(crate) client: Client,
    pub(crate) lease: i64,
    /// How often the lease is renewed: a third of the TTL etcd granted.
    period: Duration,
    keeper: LeaseKeeper,
    beats: LeaseKeepAliveStream,
    watch: WatchStream,
}

/// An etcd call of [`establish`] that failed, and which.
#[derive(Debug, thiserror::Error)]
#[error("{step}: {error}")]
pub(crate) struct Failure {
    pub(crate) step: &'static str,
    pub(crate) error: etcd_client::Error,
}

impl Failure {
    /// Whether the error is etcd (or the network) being away rather than etcd saying no.
    pub(crate) fn retryable(&self) -> bool {
        use etcd_client::Error as E;
        // gRPC status codes (a wire standard) that a retry does not change: invalid argument,
        // permission denied, resource exhausted (etcd's quota), failed precondition, out of
        // range, unimplemented, unauthenticated.
        const FINAL: [i32; 7] = [3, 7, 8, 9, 11, 12, 16];
        match &self.error {
            E::InvalidArgs(_) | E::InvalidUri(_) => false,
            E::GRpcStatus(status) => !FINAL.contains(&(status.code() as i32)),
            _ => true,
        }
    }
}

/// Why a session ended (logged; the membership reconnects).
#[derive(Debug, thiserror::Error)]
pub(crate) enum Lost {
    #[error("{0}: {1}")]
    Etcd(&'static str, etcd_client::Error),
    #[error("a lease renewal got no answer within {0:?}")]
    NoBeat(Duration),
    #[error("the lease had expired")]
    LeaseExpired,
    #[error("etcd closed the {0} stream")]
    Closed(&'static str),
    #[error("etcd canceled the watch ({0}; compacted up to revision {1})")]
    WatchCanceled(String, i64),
}

fn step(step: &'static str) -> impl FnOnce(etcd_client::Error) -> Failure {
    move |error| Failure { step, error }
}

/// Connects, registers, puts the alive key on a new lease (then revokes `old_lease`: the key has
/// moved off it), and resets `state` from a listing that the watch continues from.
pub(crate) async fn establish(
    spec: &JoinSpec,
    old_lease: Option<i64>,
    state: &mut RosterState,
) -> Result<Session, Failure> {
    let options = ConnectOptions::new().with_connect_timeout(spec.connect_timeout);
    let mut client = Client::connect(&spec.endpoints, Some(options)).await.map_err(step("connect"))?;
    // Serializing a Member (strings and a float) cannot fail; a NaN weight is refused at join.
    let registration = serde_json::to_vec(&spec.me).unwrap_or_default();
    client
        .put(spec.keys.registered(&spec.me.id), registration, None)
        .await
        .map_err(step("register the node"))?;
    let ttl = i64::try_from(spec.lease_ttl.as_millis().div_ceil(1000)).unwrap_or(i64::MAX).max(1);
    let granted = client.lease_grant(ttl, None).await.map_err(step("grant a lease"))?;
    let (lease, granted_ttl) = (granted.id(), granted.ttl().max(1));
    let alive = spec.keys.alive(&spec.me.id, spec.slot);
    client
        .put(alive, Vec::new(), Some(PutOptions::new().with_lease(lease)))
        .await
        .map_err(step("put the alive key"))?;
    if let Some(old) = old_lease {
        // Best effort: it may have expired already, and if not it would expire by itself.
        let _ = client.lease_revoke(old).await;
    }
    let prefix = spec.keys.prefix();
    let listing =
        client.get(prefix, Some(GetOptions::new().with_prefix())).await.map_err(step("list the members"))?;
    let revision = listing.header().map(|h| h.revision()).unwrap_or(0);
    state.reset(listing.kvs().iter().map(|kv| (kv.key(), kv.value())));
    let watch = client
        .watch(prefix, Some(WatchOptions::new().with_prefix().with_start_revision(revision + 1)))
        .await
        .map_err(step("watch the members"))?;
    let (keeper, beats) = client.lease_keep_alive(lease).await.map_err(step("renew the lease"))?;
    let period = Duration::from_millis(granted_ttl.unsigned_abs().saturating_mul(1000) / 3);
    Ok(Session { client, lease, period, keeper, beats, watch })
}

/// Renews the lease every period and applies watch events to `state` (publishing each change)
/// until the session is lost; returns why.
pub(crate) async fn serve(
    session: &mut Session,
    state: &mut RosterState,
    tx: &watch::Sender<Roster>,
) -> Lost {
    let mut tick = tokio::time::interval(session.period);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    // A renewal sent at the last tick and not answered by this one means etcd is away.
    let mut unanswered = false;
    loop {
        tokio::select! {
            _ = tick.tick() => {
                if unanswered {
                    return Lost::NoBeat(session.period);
                }
                if let Err(e) = session.keeper.keep_alive().await {
                    return Lost::Etcd("renew the lease", e);
                }
                unanswered = true;
            }
            beat = session.beats.message() => match beat {
                Ok(Some(beat)) if beat.ttl() > 0 => unanswered = false,
                Ok(Some(_)) => return Lost::LeaseExpired,
                Ok(None) => return Lost::Closed("lease keep-alive"),
                Err(e) => return Lost::Etcd("renew the lease", e),
            },
            message = session.watch.message() => match message {
                Ok(Some(response)) => {
                    if response.canceled() {
                        let reason = response.cancel_reason().to_owned();
                        return Lost::WatchCanceled(reason, response.compact_revision());
                    }
                    for event in response.events() {
                        // Not `event_type()`, which panics on a type it does not know: a deletion
                        // is the one event whose key-value has version 0 (etcd's tombstone).
                        match event.kv() {
                            Some(kv) if kv.version() == 0 => state.delete(kv.key()),
                            Some(kv) => state.put(kv.key(), kv.value()),
                            None => {}
                        }
                    }
                    publish(state, tx);
                }
                Ok(None) => return Lost::Closed("watch"),
                Err(e) => return Lost::Etcd("watch", e),
            },
        }
    }
}

/// Sends the roster `state` makes if it differs from the last one.
pub(crate) fn publish(state: &RosterState, tx: &watch::Sender<Roster>) {
    let roster = state.roster();
    tx.send_if_modified(|current| {
        let changed = *current != roster;
        if changed {
            *current = roster;
        }
        changed
    });
}
