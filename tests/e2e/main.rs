//! End-to-end tests: a real S3-protocol server (moto) on loopback, real `memarts-proxy` processes
//! started by the real `memarts` CLI, real Unix sockets, and the real shim.

mod common;

mod batch;
mod cache_dir_trust;
mod cache_hits;
mod capacity;
mod cli_data;
mod cli_messages;
mod cluster;
mod cluster_etcd;
mod cluster_secret;
mod cluster_security;
mod consistency;
mod crash_leftovers;
mod credentials;
mod fill;
mod fork;
mod install;
mod io_engine_fallback;
mod lifecycle;
mod local_read_reports;
mod local_reads;
mod memarts_only;
mod mount;
mod origin_errors;
mod origin_faults;
mod packed_local_reads;
mod prefetch;
mod protocol_abuse;
mod reads;
mod resident;
mod restart;
mod revalidation;
mod secrets;
mod small_objects;
mod stream;
mod supervise;
mod traced;
mod trust;
mod upload;
