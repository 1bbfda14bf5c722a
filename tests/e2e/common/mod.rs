//! Shared helpers of the end-to-end tests.

pub mod cluster;
pub mod etcd;
pub mod fault_relay;
pub mod files;
pub mod fleet;
pub mod foreign;
pub mod moto;
pub mod mount;
pub mod peer_relay;
pub mod raw;
pub mod seccomp;
pub mod slot_relay;

pub use fleet::{pattern, text, Fleet};
pub use moto::moto;
