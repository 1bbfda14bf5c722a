//! The listening half of a relay in front of a node's peer ports (slot `k` on the node's port + `k`):
//! one thread per slot port accepts connections until told to stop and hands each, with the
//! address of the same slot upstream, to the relay's own code. Shared by the on-path attacker
//! (`peer_relay.rs`) and the faulty link of the reliability campaign.
// Shared by the end-to-end tests and the reliability campaign; each uses a part of it.
#![allow(dead_code)]

use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use memarts_proxy::cluster::peer_client::slot_address;

/// Accept threads for each of `slots` ports of `from`, each calling `relay(slot, client,
/// upstream)` with the same slot's address of `to`, until `stop`.
pub fn accept_slots<F>(
    from: &str,
    to: &str,
    slots: u32,
    stop: &Arc<AtomicBool>,
    relay: F,
) -> Vec<std::thread::JoinHandle<()>>
where
    F: Fn(u32, TcpStream, &str) + Clone + Send + 'static,
{
    (0..slots)
        .map(|k| {
            let listener = TcpListener::bind(slot_address(from, k).unwrap()).expect("bind the relay");
            listener.set_nonblocking(true).unwrap();
            let (upstream, stop, relay) = (slot_address(to, k).unwrap(), stop.clone(), relay.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((client, _)) => relay(k, client, &upstream),
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            std::thread::sleep(Duration::from_millis(5))
                        }
                        Err(_) => {}
                    }
                }
            })
        })
        .collect()
}
