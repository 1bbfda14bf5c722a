//! A cluster pool for a test: `n` nodes, each a real fleet (`memarts start_proxy` with `--cluster`
//! and `--node`) with its own run dir and cache dir, listening for peers on its own loopback address
//! (127.0.0.2, 127.0.0.3, ...), all reaching the shared moto origin. A static node list and a secret
//! file (0600) in the test's temp dir.
// Shared by the cluster tests and the reliability campaign; each uses a part of it.
#![allow(dead_code)]

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::time::Duration;

use memarts_shim::{Client, ShimConfig};

use super::fleet::Fleet;
use super::text;

pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub file: PathBuf,
    pub nodes: Vec<Fleet>,
    pub ids: Vec<String>,
    pub addresses: Vec<String>,
    pub slots: u32,
}

/// A base port whose `slots` ports are free on every one of `ips`.
pub fn free_ports(ips: &[String], slots: u32) -> u16 {
    for _ in 0..200 {
        let base: u16 = 20_000 + rand::random::<u16>() % 30_000;
        let free = ips.iter().all(|ip| {
            (0..slots).all(|s| std::net::TcpListener::bind((ip.as_str(), base + s as u16)).is_ok())
        });
        if free {
            return base;
        }
    }
    panic!("no free peer ports on {ips:?}");
}

impl Cluster {
    /// `n` nodes of `slots` slots each, with `extra` lines in the cluster file and `env` for every
    /// fleet; started.
    pub fn start(n: usize, slots: u32, extra: &str, env: &[(&str, &str)]) -> Cluster {
        let c = Cluster::new(n, slots, extra, env);
        for i in 0..n {
            c.start_node(i);
        }
        c
    }

    /// `n` nodes whose membership is etcd at `endpoint` (cluster `name`), none started: each node
    /// registers itself with its own `--peer-address` when it starts.
    pub fn with_etcd(n: usize, slots: u32, endpoint: &str, name: &str, extra: &str) -> Cluster {
        Cluster::build(n, slots, Some((endpoint, name)), extra, &[])
    }

    /// The cluster's files and fleets, none started.
    pub fn new(n: usize, slots: u32, extra: &str, env: &[(&str, &str)]) -> Cluster {
        Cluster::build(n, slots, None, extra, env)
    }

    fn build(n: usize, slots: u32, etcd: Option<(&str, &str)>, extra: &str, env: &[(&str, &str)]) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("cluster.secret");
        std::fs::write(&secret, format!("{:032x}{:032x}\n", rand::random::<u128>(), rand::random::<u128>()))
            .unwrap();
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
        let ips: Vec<String> = (0..n).map(|i| format!("127.0.0.{}", i + 2)).collect();
        let port = free_ports(&ips, slots);
        let ids: Vec<String> = (0..n).map(|i| format!("node-{}", (b'a' + i as u8) as char)).collect();
        let addresses: Vec<String> = ips.iter().map(|ip| format!("{ip}:{port}")).collect();
        let mut toml = format!("secret_file = {:?}\n{extra}\n", secret.display().to_string());
        match etcd {
            Some((endpoint, name)) => toml.push_str(&format!("etcd = [\"{endpoint}\"]\nname = \"{name}\"\n")),
            None => {
                for (id, address) in ids.iter().zip(&addresses) {
                    toml.push_str(&format!("[[nodes]]\nid = \"{id}\"\naddress = \"{address}\"\n"));
                }
            }
        }
        let file = dir.path().join("cluster.toml");
        std::fs::write(&file, toml).unwrap();
        let nodes = ids
            .iter()
            .zip(&addresses)
            .map(|(id, address)| {
                let mut all: Vec<(&str, &str)> =
                    vec![("MEMARTS_CLUSTER", file.to_str().unwrap()), ("MEMARTS_NODE_ID", id)];
                if etcd.is_some() {
                    all.push(("MEMARTS_PEER_ADDRESS", address));
                }
                all.extend_from_slice(env);
                Fleet::new(&all)
            })
            .collect();
        Cluster { dir, file, nodes, ids, addresses, slots }
    }

    pub fn start_node(&self, i: usize) {
        self.nodes[i].start_proxy(self.slots);
    }

    /// A client of node `i`'s fleet.
    pub fn client(&self, i: usize, chunk_size: u64) -> Client {
        Client::new(ShimConfig {
            run_dir: self.nodes[i].run_dir.clone(),
            chunk_size,
            parallel: 8,
            deadline: Duration::from_secs(60),
            ..ShimConfig::default()
        })
        .expect("client")
    }

    /// `memarts cluster status --json` on node `i`.
    pub fn status(&self, i: usize) -> serde_json::Value {
        let out = self.nodes[i].memarts(&["cluster", "status", "--json"]);
        assert!(out.status.success(), "cluster status: {}{}", text(&out.stdout), text(&out.stderr));
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("cluster status --json: {e}: {}", text(&out.stdout)))
    }

    /// A counter of `memarts cluster status --json` for node `of`, as node `i` reports it.
    pub fn counter(&self, i: usize, of: usize, name: &str) -> u64 {
        let status = self.status(i);
        let member =
            status["members"].as_array().unwrap().iter().find(|m| m["id"] == self.ids[of]).unwrap().clone();
        member["counters"][name].as_u64().unwrap_or_else(|| panic!("no counter {name} in {member}"))
    }

    /// The lines of every node's slot logs that contain `needle` (for a failing test to show).
    pub fn log_lines(&self, needle: &str) -> Vec<String> {
        let mut out = Vec::new();
        for (i, node) in self.nodes.iter().enumerate() {
            for slot in 0..self.slots {
                let log = std::fs::read_to_string(node.run_dir.join(format!("proxy-{slot}.log")))
                    .unwrap_or_default();
                out.extend(
                    log.lines()
                        .filter(|l| l.contains(needle))
                        .map(|l| format!("{}/{slot}: {l}", self.ids[i])),
                );
            }
        }
        out
    }

    /// The origin GETs of the same bytes made more than once in the cluster, each with the lines of
    /// every node's and slot's origin request log that made it (for a failing test to show).
    pub fn repeated_gets(&self) -> Vec<String> {
        let dirs: Vec<_> =
            self.nodes.iter().enumerate().map(|(i, n)| (self.ids[i].clone(), n.run_dir.clone())).collect();
        super::fleet::repeated_gets(&dirs, self.slots)
    }

    /// Pids of node `i`'s slots.
    pub fn pids(&self, i: usize) -> Vec<i32> {
        (0..self.slots).map(|s| self.nodes[i].pid(s)).collect()
    }

    /// Sends `signal` to every slot of node `i`.
    pub fn signal(&self, i: usize, signal: nix::sys::signal::Signal) {
        for pid in self.pids(i) {
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal).unwrap();
        }
    }

    /// Waits until every member node `i` sees is alive again.
    pub fn wait_all_alive(&self, i: usize) {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let status = self.status(i);
            let members = status["members"].as_array().unwrap();
            if members.iter().all(|m| m["state"] == "alive") {
                return;
            }
            assert!(std::time::Instant::now() < deadline, "members never all alive: {status}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}
