//! The cluster pool: the fleets of several nodes form one cache. A chunk has one owning node
//! (rendezvous hashing over the *registered* members, weighted), and inside it the owning slot as on
//! one node; a miss on another node is read from the owner over authenticated TCP, so a chunk leaves
//! the object store once per cluster and the pool holds the sum of the nodes' capacity.
//!
//! - `members.rs`: who is in the cluster ([`Member`], [`Roster`]).
//! - `roster_snapshot.rs`: the last known roster on disk ([`save_snapshot`], [`load_snapshot`],
//!   [`keep_saving`]), to start from when etcd is unreachable.

pub mod members;
pub mod roster_snapshot;

pub use members::{Member, Roster};
pub use roster_snapshot::{keep_saving, load_snapshot, save_snapshot};
