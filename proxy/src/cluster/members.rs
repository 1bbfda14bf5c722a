//! Who is in the cluster. Ownership is computed over the *registered* members, so a node that blips
//! or restarts owns the same chunks when it is back (C2); which of them are alive only changes where a
//! read is routed.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

/// One node of the cluster, as the membership knows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Member {
    /// The node's identity (`--node`), stable across restarts and address changes.
    pub id: String,
    /// `host:port` of the node's peer listener: slot `k` of the node listens on `port + k`.
    pub address: String,
    /// Share of the chunks the node owns, relative to the others (its capacity, say); 1.0 by default.
    #[serde(default = "default_weight")]
    pub weight: f64,
}

fn default_weight() -> f64 {
    1.0
}

/// The members at one moment: who is registered (sorted by id, ids unique) and who the membership
/// says is up now. With a static node list every registered member counts as up; failed reads mark a
/// peer suspect on top of this (`liveness`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Roster {
    pub registered: Vec<Member>,
    pub alive: BTreeSet<String>,
}

impl Roster {
    /// A roster of `members`, all alive (static membership).
    pub fn all_alive(mut members: Vec<Member>) -> Roster {
        members.sort_by(|a, b| a.id.cmp(&b.id));
        let alive = members.iter().map(|m| m.id.clone()).collect();
        Roster { registered: members, alive }
    }

    pub fn member(&self, id: &str) -> Option<&Member> {
        self.registered.iter().find(|m| m.id == id)
    }
}
