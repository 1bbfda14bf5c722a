//! How a node joins a cluster. Two parts:
//!
//! - [`ClusterSettings`], this node's: which cluster file, which node it is (`--cluster FILE --node
//!   ID`, `MEMARTS_CLUSTER` / `MEMARTS_NODE_ID`, or the `[cluster]` table of the config file) and, for
//!   etcd membership, its own peer address (`--peer-address`). It travels in `fleet.json`.
//! - [`ClusterFile`], shared by every member (TOML): the secret file, then either the static node
//!   list (`[[nodes]]` with `id`, `address`, `weight`) or etcd (`etcd = [...]`, `name`), and the
//!   peer timeouts.
//!
//! [`ClusterSettings::resolve`] reads and checks both; every error names the setting and the file.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::auth::Secret;
use super::members::Member;

// Declared here, not in `cluster/mod.rs`: the secret file is part of what `resolve` reads.
#[path = "secret_file.rs"]
pub mod secret_file;

/// This node's part: see the module docs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSettings {
    /// The cluster file.
    pub file: PathBuf,
    /// This node's id, as the cluster file (or etcd) knows it.
    pub node: String,
    /// This node's peer listener, `host:port` (slot `k` listens on `port + k`): required with etcd,
    /// where it is registered; with a static list it comes from the list.
    #[serde(default)]
    pub peer_address: Option<String>,
    /// Where this node's slots bind (slot `k` on `port + k`) when that is not the address peers dial:
    /// behind NAT or a container's port mapping, or `0.0.0.0:PORT`. Default: the node's address.
    #[serde(default)]
    pub peer_listen: Option<String>,
}

/// The file every member shares: see the module docs.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterFile {
    /// The cluster secret, which peers prove they hold: a file of this proxy's uid that no other
    /// user can read or write, with at least 256 bits of entropy (`secret_file.rs`).
    pub secret_file: PathBuf,
    #[serde(default)]
    pub nodes: Vec<Member>,
    /// etcd endpoints, e.g. `["http://127.0.0.1:2379"]`, instead of `nodes`.
    #[serde(default)]
    pub etcd: Vec<String>,
    /// The cluster's name in etcd (several jobs can share one etcd).
    #[serde(default)]
    pub name: Option<String>,
    /// With etcd unreachable at start, start from the membership last seen (saved in the cache dir)
    /// instead of failing.
    #[serde(default)]
    pub start_from_last_known: bool,
    /// A peer that has not answered a request within this long is routed around.
    #[serde(default = "default_peer_timeout")]
    pub peer_timeout_secs: f64,
    /// Connecting to a peer and the handshake must take no longer than this.
    #[serde(default = "default_connect_timeout")]
    pub connect_timeout_secs: f64,
    /// How long a peer that failed a read is left alone before it is asked again.
    #[serde(default = "default_suspect")]
    pub suspect_secs: f64,
    /// The etcd lease of each slot's "alive" key.
    #[serde(default = "default_lease")]
    pub lease_ttl_secs: f64,
}

// Generous, so that a busy node is not taken for a dead one (Alluxio found 2 s too aggressive): a
// dead node refuses at once anyway, and a hung one costs each read at most this once.
fn default_peer_timeout() -> f64 {
    10.0
}
fn default_connect_timeout() -> f64 {
    2.0
}
fn default_suspect() -> f64 {
    3.0
}
fn default_lease() -> f64 {
    5.0
}

/// Where the members come from.
#[derive(Debug, Clone, PartialEq)]
pub enum Membership {
    Static(Vec<Member>),
    Etcd { endpoints: Vec<String>, name: String, start_from_last_known: bool },
}

/// A checked cluster configuration, ready for a slot to join with.
#[derive(Debug, Clone)]
pub struct Plan {
    pub me: Member,
    /// Where this node's slots bind: `peer_listen`, else the node's address.
    pub listen: String,
    pub membership: Membership,
    pub secret: Secret,
    pub peer_timeout: Duration,
    pub connect_timeout: Duration,
    pub suspect: Duration,
    pub lease_ttl: Duration,
}

/// A cluster configuration that cannot be used; each names the file or setting at fault.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterError {
    #[error("cluster file {}: {source}", path.display())]
    Unreadable {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cluster file {}: {message}", path.display())]
    Invalid { path: PathBuf, message: String },
    /// The secret file is unreadable, not private to this proxy's uid, or too weak.
    #[error("cluster secret_file {}: {problem}", path.display())]
    Secret { path: PathBuf, problem: secret_file::SecretFileError },
}

impl ClusterSettings {
    /// Reads and checks the cluster file and the secret for a fleet of `slots` slots.
    pub fn resolve(&self, slots: u32) -> Result<Plan, ClusterError> {
        let path = &self.file;
        let invalid = |message: String| ClusterError::Invalid { path: path.clone(), message };
        let text = std::fs::read_to_string(path)
            .map_err(|source| ClusterError::Unreadable { path: path.clone(), source })?;
        let file: ClusterFile = toml::from_str(&text).map_err(|e| invalid(e.to_string()))?;
        for (name, v) in [
            ("peer_timeout_secs", file.peer_timeout_secs),
            ("connect_timeout_secs", file.connect_timeout_secs),
            ("suspect_secs", file.suspect_secs),
            ("lease_ttl_secs", file.lease_ttl_secs),
        ] {
            if !(v.is_finite() && v > 0.0 && v < 1e6) {
                return Err(invalid(format!("{name} must be a positive number of seconds, got {v}")));
            }
        }
        if self.node.is_empty() {
            return Err(invalid("this node's id (--node, MEMARTS_NODE_ID) is empty".into()));
        }
        let secret_path = resolve_path(path, &file.secret_file);
        let secret = secret_file::read_secret(&secret_path)
            .map_err(|problem| ClusterError::Secret { path: secret_path, problem })?;
        let (me, membership) = match (file.nodes.is_empty(), file.etcd.is_empty()) {
            (false, false) => return Err(invalid("give either [[nodes]] or etcd, not both".into())),
            (true, true) => return Err(invalid("no members: give [[nodes]] (a static list) or etcd".into())),
            (false, true) => {
                check_nodes(&file.nodes, slots).map_err(|e| invalid(e.to_string()))?;
                let Some(me) = file.nodes.iter().find(|m| m.id == self.node) else {
                    let ids: Vec<&str> = file.nodes.iter().map(|m| m.id.as_str()).collect();
                    return Err(invalid(format!(
                        "node {:?} is not in its [[nodes]] ({})",
                        self.node,
                        ids.join(", ")
                    )));
                };
                if self.peer_address.as_ref().is_some_and(|a| a != &me.address) {
                    return Err(invalid(format!(
                        "--peer-address {} differs from node {:?}'s address {} in the file",
                        self.peer_address.as_deref().unwrap_or_default(),
                        me.id,
                        me.address
                    )));
                }
                (me.clone(), Membership::Static(file.nodes.clone()))
            }
            (true, false) => {
                let name = file.name.clone().filter(|n| !n.is_empty()).ok_or_else(|| {
                    invalid("etcd membership needs the cluster's name (name = \"job-42\")".into())
                })?;
                let Some(address) = self.peer_address.clone() else {
                    return Err(invalid(
                        "etcd membership needs this node's peer address (--peer-address HOST:PORT)".into(),
                    ));
                };
                let me = Member { id: self.node.clone(), address, weight: 1.0 };
                check_nodes(std::slice::from_ref(&me), slots).map_err(|e| invalid(e.to_string()))?;
                let membership = Membership::Etcd {
                    endpoints: file.etcd.clone(),
                    name,
                    start_from_last_known: file.start_from_last_known,
                };
                (me, membership)
            }
        };
        let listen = self.peer_listen.clone().unwrap_or_else(|| me.address.clone());
        if let Some(l) = &self.peer_listen {
            check_address(l, slots)
                .map_err(|why| invalid(format!("peer listen address (--peer-listen) {l:?}: {why}")))?;
        }
        Ok(Plan {
            listen,
            me,
            membership,
            secret,
            peer_timeout: Duration::from_secs_f64(file.peer_timeout_secs),
            connect_timeout: Duration::from_secs_f64(file.connect_timeout_secs),
            suspect: Duration::from_secs_f64(file.suspect_secs),
            lease_ttl: Duration::from_secs_f64(file.lease_ttl_secs),
        })
    }
}

/// A relative `secret_file` is relative to the cluster file's directory.
fn resolve_path(cluster_file: &Path, secret: &Path) -> PathBuf {
    match cluster_file.parent() {
        Some(dir) if secret.is_relative() => dir.join(secret),
        _ => secret.to_path_buf(),
    }
}

/// What is wrong with a cluster file's node list.
#[derive(Debug, thiserror::Error)]
pub enum BadNode {
    #[error("node id {0:?} must be 1 to 255 bytes")]
    IdLength(String),
    #[error("node id {0:?} appears twice")]
    IdTwice(String),
    #[error("address {0} appears twice (nodes must not share a peer address)")]
    AddressTwice(String),
    #[error("node {node:?}: address {why}")]
    Address { node: String, why: BadAddress },
    #[error("node {node:?}: weight must be a positive number, got {weight}")]
    Weight { node: String, weight: f64 },
}

/// A peer address that is not `HOST:PORT` with a port for every slot (`port + slot`).
#[derive(Debug, thiserror::Error)]
pub enum BadAddress {
    #[error("{0:?} is not HOST:PORT")]
    NotHostPort(String),
    #[error("{address:?}: port {port} leaves no room for {slots} slots (port + slot)")]
    NoRoom { address: String, port: u16, slots: u32 },
}

/// Unique ids and addresses, `host:port` addresses with room for every slot's port, weights > 0.
fn check_nodes(nodes: &[Member], slots: u32) -> Result<(), BadNode> {
    let mut ids = std::collections::BTreeSet::new();
    let mut addresses = std::collections::BTreeSet::new();
    for m in nodes {
        if m.id.is_empty() || m.id.len() > 255 {
            return Err(BadNode::IdLength(m.id.clone()));
        }
        if !ids.insert(m.id.as_str()) {
            return Err(BadNode::IdTwice(m.id.clone()));
        }
        if !addresses.insert(m.address.as_str()) {
            return Err(BadNode::AddressTwice(m.address.clone()));
        }
        check_address(&m.address, slots).map_err(|why| BadNode::Address { node: m.id.clone(), why })?;
        if !(m.weight.is_finite() && m.weight > 0.0) {
            return Err(BadNode::Weight { node: m.id.clone(), weight: m.weight });
        }
    }
    Ok(())
}

/// `HOST:PORT` with room for every slot's port (`port + slot`).
pub fn check_address(address: &str, slots: u32) -> Result<u16, BadAddress> {
    let port = address.rsplit_once(':').and_then(|(host, port)| (!host.is_empty()).then_some(port));
    let Some(port) = port.and_then(|p| p.parse::<u16>().ok()).filter(|p| *p > 0) else {
        return Err(BadAddress::NotHostPort(address.to_string()));
    };
    if u32::from(port) + slots.max(1) - 1 > u32::from(u16::MAX) {
        return Err(BadAddress::NoRoom { address: address.to_string(), port, slots });
    }
    Ok(port)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn setup(body: &str, secret_mode: u32) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("cluster.secret");
        std::fs::write(&secret, format!("{}\n", "5e".repeat(32))).unwrap();
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(secret_mode)).unwrap();
        let file = dir.path().join("cluster.toml");
        std::fs::write(&file, format!("secret_file = \"cluster.secret\"\n{body}")).unwrap();
        (dir, file)
    }

    const THREE: &str = "[[nodes]]\nid = \"a\"\naddress = \"127.0.0.2:7070\"\n\
        [[nodes]]\nid = \"b\"\naddress = \"127.0.0.3:7070\"\nweight = 2.0\n\
        [[nodes]]\nid = \"c\"\naddress = \"127.0.0.4:7070\"\n";

    fn resolve(file: &Path, node: &str, peer: Option<&str>) -> Result<Plan, ClusterError> {
        let settings = ClusterSettings {
            file: file.to_path_buf(),
            node: node.into(),
            peer_address: peer.map(Into::into),
            peer_listen: None,
        };
        settings.resolve(4)
    }

    #[test]
    fn a_static_list_resolves_to_this_node_and_its_members() {
        let (_dir, file) = setup(THREE, 0o600);
        let plan = resolve(&file, "b", None).unwrap();
        assert_eq!(
            (plan.me.id.as_str(), plan.me.address.as_str(), plan.me.weight),
            ("b", "127.0.0.3:7070", 2.0)
        );
        assert!(matches!(&plan.membership, Membership::Static(m) if m.len() == 3));
        assert_eq!(plan.peer_timeout, Duration::from_secs(10));
    }

    #[test]
    fn bad_configurations_name_what_is_wrong() {
        let cases = [
            (THREE, "z", None, "node \"z\" is not in its [[nodes]] (a, b, c)"),
            (
                "[[nodes]]\nid = \"a\"\naddress = \"h:1\"\n[[nodes]]\nid = \"a\"\naddress = \"h:2\"\n",
                "a",
                None,
                "appears twice",
            ),
            (
                "[[nodes]]\nid = \"a\"\naddress = \"h:1\"\n[[nodes]]\nid = \"b\"\naddress = \"h:1\"\n",
                "a",
                None,
                "address h:1 appears twice",
            ),
            ("[[nodes]]\nid = \"a\"\naddress = \"nohost\"\n", "a", None, "is not HOST:PORT"),
            ("[[nodes]]\nid = \"a\"\naddress = \"h:65534\"\n", "a", None, "no room for 4 slots"),
            ("[[nodes]]\nid = \"a\"\naddress = \"h:1\"\nweight = 0.0\n", "a", None, "weight"),
            ("", "a", None, "no members"),
            ("etcd = [\"http://127.0.0.1:2379\"]\n", "a", Some("h:1"), "name"),
            ("etcd = [\"http://127.0.0.1:2379\"]\nname = \"j\"\n", "a", None, "--peer-address"),
            ("peer_timeout_secs = -1.0\n", "a", None, "peer_timeout_secs"),
            ("colour = \"blue\"\n", "a", None, "colour"),
            (THREE, "a", Some("127.0.0.9:1"), "differs"),
        ];
        for (body, node, peer, expected) in cases {
            let (_dir, file) = setup(body, 0o600);
            let err = resolve(&file, node, peer).unwrap_err().to_string();
            assert!(err.contains(expected), "{expected:?} not in: {err}");
            assert!(err.contains("cluster.toml"), "{err}");
        }
    }

    #[test]
    fn the_secret_must_be_private_and_strong_enough() {
        let (dir, file) = setup(THREE, 0o644);
        let err = resolve(&file, "a", None).unwrap_err().to_string();
        assert!(err.contains("readable by other users") && err.contains("chmod 600"), "{err}");
        std::fs::write(dir.path().join("cluster.secret"), "short").unwrap();
        std::fs::set_permissions(dir.path().join("cluster.secret"), std::fs::Permissions::from_mode(0o600))
            .unwrap();
        let err = resolve(&file, "a", None).unwrap_err().to_string();
        assert!(err.contains("about 30 bits of entropy") && err.contains("head -c 32"), "{err}");
        std::fs::remove_file(dir.path().join("cluster.secret")).unwrap();
        assert!(matches!(resolve(&file, "a", None), Err(ClusterError::Secret { .. })));
    }

    #[test]
    fn etcd_membership_takes_the_peer_address_from_the_flag() {
        let (_dir, file) = setup("etcd = [\"http://127.0.0.1:2379\"]\nname = \"job-42\"\n", 0o600);
        let plan = resolve(&file, "n1", Some("127.0.0.5:7070")).unwrap();
        assert_eq!(plan.me.address, "127.0.0.5:7070");
        assert!(matches!(plan.membership, Membership::Etcd { ref name, .. } if name == "job-42"));
    }

    #[test]
    fn slots_bind_the_peer_address_unless_a_listen_address_is_given() {
        let (_dir, file) = setup(THREE, 0o600);
        assert_eq!(resolve(&file, "a", None).unwrap().listen, "127.0.0.2:7070");
        let with = |listen: &str| {
            let settings = ClusterSettings {
                file: file.clone(),
                node: "a".into(),
                peer_address: None,
                peer_listen: Some(listen.into()),
            };
            settings.resolve(4)
        };
        let plan = with("0.0.0.0:9000").unwrap();
        assert_eq!((plan.listen.as_str(), plan.me.address.as_str()), ("0.0.0.0:9000", "127.0.0.2:7070"));
        let err = with("0.0.0.0").unwrap_err().to_string();
        assert!(err.contains("--peer-listen") && err.contains("HOST:PORT"), "{err}");
        let err = with("0.0.0.0:65534").unwrap_err().to_string();
        assert!(err.contains("no room for 4 slots"), "{err}");
    }
}
