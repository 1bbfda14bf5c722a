//! The cluster pool: the fleets of several nodes form one cache. A chunk has one owning node
//! (rendezvous hashing over the *registered* members, weighted), and inside it the owning slot as on
//! one node; a miss on another node is read from the owner over authenticated TCP, so a chunk leaves
//! the object store once per cluster and the pool holds the sum of the nodes' capacity.
//!
//! - `members.rs`: who is in the cluster ([`Member`], [`Roster`]).
//! - `roster_snapshot.rs`: the last known roster on disk ([`save_snapshot`], [`load_snapshot`],
//!   [`keep_saving`]), to start from when etcd is unreachable.
//! - `etcd.rs` (feature `etcd`): membership from etcd for elastic jobs (`EtcdMembership`): its
//!   key layout, join and leave, reconnection; `etcd_session.rs` one connection's lease renewals and
//!   watch; `etcd_keys.rs` the keys and the roster read from them; `etcd_tests.rs` its tests
//!   against a real etcd.

#[cfg(feature = "etcd")]
pub mod etcd;
#[cfg(feature = "etcd")]
mod etcd_keys;
#[cfg(feature = "etcd")]
mod etcd_session;
#[cfg(all(test, feature = "etcd"))]
mod etcd_tests;
pub mod members;
pub mod roster_snapshot;

#[cfg(feature = "etcd")]
pub use etcd::{EtcdError, EtcdMembership};
pub use members::{Member, Roster};
pub use roster_snapshot::{keep_saving, load_snapshot, save_snapshot};
