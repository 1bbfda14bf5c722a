//! The cluster pool: the fleets of several nodes form one cache. A chunk has one owning node
//! (rendezvous hashing over the *registered* members, weighted), and inside it the owning slot as on
//! one node; a miss on another node is read from the owner over authenticated TCP, so a chunk leaves
//! the object store once per cluster and the pool holds the sum of the nodes' capacity.
//!
//! - `members.rs`: who is in the cluster ([`Member`], [`Roster`]).

pub mod members;

pub use members::{Member, Roster};
