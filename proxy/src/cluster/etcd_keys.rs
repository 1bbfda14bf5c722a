//! The etcd membership's key layout (described in `etcd.rs`) and the roster read from those keys:
//! pure bookkeeping, fed by a listing of the prefix and then by watch events, so it can be tested
//! without an etcd. Nothing etcd returns makes it panic: a key or value it cannot read is skipped
//! with one warning per key.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use super::members::{Member, Roster};

/// The keys of one cluster: `/memarts/<name>/registered/<node>` and `/memarts/<name>/alive/<node>/<slot>`.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    prefix: String,
}

/// What a key under the cluster's prefix is.
#[derive(Debug, PartialEq)]
enum Key<'a> {
    Registered(&'a str),
    Alive(&'a str, u32),
}

/// Whether `part` can be one path component of a key: a cluster name or a node id.
pub(crate) fn valid_component(part: &str) -> bool {
    !part.is_empty() && !part.contains('/') && part.chars().all(|c| !c.is_control())
}

impl Keys {
    pub(crate) fn new(cluster: &str) -> Keys {
        Keys { prefix: format!("/memarts/{cluster}/") }
    }

    /// The prefix that holds every key of the cluster (listed and watched as one range).
    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    pub(crate) fn registered(&self, node: &str) -> String {
        format!("{}registered/{node}", self.prefix)
    }

    pub(crate) fn alive(&self, node: &str, slot: u32) -> String {
        format!("{}alive/{node}/{slot}", self.prefix)
    }

    fn parse<'a>(&self, key: &'a str) -> Option<Key<'a>> {
        let rest = key.strip_prefix(self.prefix.as_str())?;
        if let Some(node) = rest.strip_prefix("registered/") {
            return valid_component(node).then_some(Key::Registered(node));
        }
        let (node, slot) = rest.strip_prefix("alive/")?.split_once('/')?;
        let slot = slot.parse().ok()?;
        valid_component(node).then_some(Key::Alive(node, slot))
    }
}

/// The cluster's keys as last seen, and the roster they make.
#[derive(Debug)]
pub(crate) struct RosterState {
    keys: Keys,
    registered: BTreeMap<String, Member>,
    alive: BTreeMap<String, BTreeSet<u32>>,
    /// Keys already warned about, so that a bad key is reported once, not at every listing.
    warned: HashSet<String>,
}

impl RosterState {
    pub(crate) fn new(keys: Keys) -> RosterState {
        RosterState { keys, registered: BTreeMap::new(), alive: BTreeMap::new(), warned: HashSet::new() }
    }

    /// Replaces everything with a listing of the prefix (after a reconnect: the listing is the
    /// whole truth, whatever events were missed).
    pub(crate) fn reset<'a>(&mut self, listing: impl IntoIterator<Item = (&'a [u8], &'a [u8])>) {
        self.registered.clear();
        self.alive.clear();
        for (key, value) in listing {
            self.put(key, value);
        }
    }

    pub(crate) fn put(&mut self, key: &[u8], value: &[u8]) {
        let Some((key, parsed)) = self.read_key(key) else { return };
        match parsed {
            Key::Registered(node) => match serde_json::from_slice::<Member>(value) {
                Ok(m) if m.id == node && m.weight.is_finite() && m.weight >= 0.0 => {
                    self.warned.remove(key);
                    self.registered.insert(node.to_owned(), m);
                }
                outcome => {
                    // Not a member (any more): the key says what it is, its value does not.
                    self.registered.remove(node);
                    let why = match outcome {
                        Err(e) => format!("not the JSON of a member: {e}"),
                        Ok(m) if m.id != node => format!("names node {:?}", m.id),
                        Ok(m) => format!("weight {} is not a finite number >= 0", m.weight),
                    };
                    self.warn_once(key, &why);
                }
            },
            Key::Alive(node, slot) => {
                self.alive.entry(node.to_owned()).or_default().insert(slot);
            }
        }
    }

    pub(crate) fn delete(&mut self, key: &[u8]) {
        let Some((key, parsed)) = self.read_key(key) else { return };
        self.warned.remove(key);
        match parsed {
            Key::Registered(node) => {
                self.registered.remove(node);
            }
            Key::Alive(node, slot) => {
                if let Some(slots) = self.alive.get_mut(node) {
                    slots.remove(&slot);
                    if slots.is_empty() {
                        self.alive.remove(node);
                    }
                }
            }
        }
    }

    /// The registered members, and those of them with at least one live slot.
    pub(crate) fn roster(&self) -> Roster {
        Roster {
            registered: self.registered.values().cloned().collect(),
            alive: self.alive.keys().filter(|id| self.registered.contains_key(*id)).cloned().collect(),
        }
    }

    fn read_key<'a>(&mut self, key: &'a [u8]) -> Option<(&'a str, Key<'a>)> {
        let Ok(text) = std::str::from_utf8(key) else {
            self.warn_once(&String::from_utf8_lossy(key), "not UTF-8");
            return None;
        };
        match self.keys.parse(text) {
            Some(parsed) => Some((text, parsed)),
            None => {
                self.warn_once(text, "not a key of the membership layout");
                None
            }
        }
    }

    fn warn_once(&mut self, key: &str, why: &str) {
        if self.warned.insert(key.to_owned()) {
            tracing::warn!(key, "etcd membership: skipping a key: {why}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> RosterState {
        RosterState::new(Keys::new("c"))
    }

    fn reg(id: &str) -> Vec<u8> {
        serde_json::to_vec(&Member { id: id.into(), address: format!("{id}:1"), weight: 1.0 }).unwrap()
    }

    fn ids(roster: &Roster) -> (Vec<&str>, Vec<&str>) {
        (
            roster.registered.iter().map(|m| m.id.as_str()).collect(),
            roster.alive.iter().map(|s| s.as_str()).collect(),
        )
    }

    #[test]
    fn layout() {
        let keys = Keys::new("job7");
        assert_eq!(keys.prefix(), "/memarts/job7/");
        assert_eq!(keys.registered("n1"), "/memarts/job7/registered/n1");
        assert_eq!(keys.alive("n1", 3), "/memarts/job7/alive/n1/3");
        assert_eq!(keys.parse("/memarts/job7/alive/n1/3"), Some(Key::Alive("n1", 3)));
        assert_eq!(keys.parse("/memarts/job7/registered/n1"), Some(Key::Registered("n1")));
        for bad in
            ["/memarts/job7/alive/n1", "/memarts/job7/alive/n1/x", "/memarts/job7/registered/a/b", "/x"]
        {
            assert_eq!(keys.parse(bad), None, "{bad}");
        }
        assert!(valid_component("node-1.example") && !valid_component("a/b") && !valid_component(""));
    }

    #[test]
    fn a_node_is_alive_while_one_of_its_slots_is() {
        let mut s = state();
        s.put(b"/memarts/c/registered/a", &reg("a"));
        s.put(b"/memarts/c/registered/b", &reg("b"));
        s.put(b"/memarts/c/alive/a/0", b"");
        s.put(b"/memarts/c/alive/a/1", b"");
        s.put(b"/memarts/c/alive/z/0", b""); // alive but not registered: not in the roster
        assert_eq!(ids(&s.roster()), (vec!["a", "b"], vec!["a"]));
        s.delete(b"/memarts/c/alive/a/0");
        assert_eq!(ids(&s.roster()).1, ["a"]);
        s.delete(b"/memarts/c/alive/a/1");
        assert_eq!(ids(&s.roster()), (vec!["a", "b"], vec![]));
    }

    #[test]
    fn anything_unreadable_is_skipped_without_panicking() {
        let mut s = state();
        s.put(b"/memarts/c/registered/a", b"{not json");
        s.put(b"/memarts/c/registered/b", &reg("other"));
        s.put(b"/memarts/c/registered/d", br#"{"id":"d","address":"x","weight":-1}"#);
        s.put(b"/memarts/c/registered/e", br#"{"id":"e","address":"x"}"#);
        s.put(b"\xff\xfe", b"");
        s.put(b"/memarts/c/alive/e/-1", b"");
        s.delete(b"/memarts/c/alive/e/7");
        s.delete(b"/memarts/c/alive/nobody/7");
        assert_eq!(ids(&s.roster()), (vec!["e"], vec![]));
        assert_eq!(s.roster().registered[0].weight, 1.0);
        // A registration overwritten with garbage stops counting; fixed, it counts again.
        s.put(b"/memarts/c/registered/e", b"");
        assert!(s.roster().registered.is_empty());
        s.put(b"/memarts/c/registered/e", &reg("e"));
        assert_eq!(ids(&s.roster()).0, ["e"]);
    }

    #[test]
    fn a_listing_replaces_what_was_known() {
        let mut s = state();
        s.put(b"/memarts/c/registered/a", &reg("a"));
        s.put(b"/memarts/c/alive/a/0", b"");
        let b = reg("b");
        s.reset([(&b"/memarts/c/registered/b"[..], &b[..]), (b"/memarts/c/alive/b/2", b"")]);
        assert_eq!(ids(&s.roster()), (vec!["b"], vec!["b"]));
    }
}
