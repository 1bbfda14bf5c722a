//! `memarts cluster status`: the cluster pool as this node sees it. The members and their states come
//! from this node's slots (a member counts as suspect or down if any slot sees it so); each node's
//! counters come from its own slots: this node's over the Unix sockets, the others' over the peer
//! protocol, authenticated with the cluster secret as the slots themselves are.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use memarts_protocol::peer::{ClusterStatus, MemberState, MemberStatus};
use memarts_proxy::cluster::peer_client::{PeerClient, PeerError};
use memarts_proxy::config::FleetConfig;
use memarts_settings::size::format_size;
use memarts_settings::Settings;
use memarts_shim::Client;
use serde_json::{json, Value};

use crate::cli::{Common, StatusArgs};
use crate::settings::{resolve, shim_config};

/// One node's counters, summed over its slots.
#[derive(Default)]
struct Totals {
    bytes_from_cache: u64,
    bytes_from_peers: u64,
    bytes_from_origin: u64,
    peer_reads: u64,
    peer_errors: u64,
    fallbacks: u64,
    served_chunks: u64,
    served_bytes: u64,
    refused_connections: u64,
    refused_requests: u64,
    forged_frames: u64,
}

impl Totals {
    fn add(&mut self, s: &ClusterStatus) {
        self.bytes_from_cache += s.bytes_from_cache;
        self.bytes_from_peers += s.bytes_from_peers;
        self.bytes_from_origin += s.bytes_from_origin;
        self.peer_reads += s.peer_reads;
        self.peer_errors += s.peer_errors;
        self.fallbacks += s.fallbacks;
        self.served_chunks += s.served_chunks;
        self.served_bytes += s.served_bytes;
        self.refused_connections += s.refused_connections;
        self.refused_requests += s.refused_requests;
        self.forged_frames += s.forged_frames;
    }

    fn json(&self) -> Value {
        json!({
            "bytes_from_cache": self.bytes_from_cache, "bytes_from_peers": self.bytes_from_peers,
            "bytes_from_origin": self.bytes_from_origin, "peer_reads": self.peer_reads,
            "peer_errors": self.peer_errors, "fallbacks": self.fallbacks,
            "served_chunks": self.served_chunks, "served_bytes": self.served_bytes,
            "refused_connections": self.refused_connections, "refused_requests": self.refused_requests,
            "forged_frames": self.forged_frames,
        })
    }
}

fn rank(state: MemberState) -> u8 {
    match state {
        MemberState::Alive => 0,
        MemberState::Suspect => 1,
        MemberState::Down => 2,
    }
}

fn state_name(state: MemberState) -> &'static str {
    match state {
        MemberState::Alive => "alive",
        MemberState::Suspect => "suspect",
        MemberState::Down => "down",
    }
}

pub fn status(common: &Common, args: &StatusArgs) -> Result<ExitCode> {
    let cfg = resolve(common)?;
    let settings = Settings::from_env()?;
    let client = Client::new(shim_config(&settings, &cfg))?;
    let slots = client.cluster_status(Duration::from_secs(3));
    let answered: Vec<&ClusterStatus> = slots.iter().filter_map(|(_, r)| r.as_ref().ok()).collect();
    let Some(first) = answered.first() else {
        bail!("no slot of the fleet in {} answered", cfg.run_dir.display());
    };
    if first.node.is_empty() {
        if args.json {
            println!("{}", json!({"cluster": false, "run_dir": cfg.run_dir}));
        } else {
            println!("memarts: the fleet in {} is not part of a cluster", cfg.run_dir.display());
        }
        return Ok(ExitCode::SUCCESS);
    }
    let me = first.node.clone();
    // Each member as the slots see it: the worst state any slot sees, since the latest change.
    let mut members: BTreeMap<String, MemberStatus> = BTreeMap::new();
    for s in &answered {
        for m in &s.members {
            let entry = members.entry(m.id.clone()).or_insert_with(|| m.clone());
            if rank(m.state) > rank(entry.state) {
                *entry = m.clone();
            }
        }
    }
    let mut totals: BTreeMap<String, std::result::Result<Totals, PeerError>> = BTreeMap::new();
    let mut local = Totals::default();
    answered.iter().for_each(|s| local.add(s));
    totals.insert(me.clone(), Ok(local));
    let remote = remote_totals(&cfg, &me, members.values().filter(|m| m.id != me).collect())?;
    totals.extend(remote);

    if args.json {
        let rows: Vec<Value> = members
            .values()
            .map(|m| {
                let mut row = json!({
                    "id": m.id, "address": m.address, "weight": m.weight, "state": state_name(m.state),
                    "since_ms": m.since_ms, "this_node": m.id == me,
                });
                match totals.get(&m.id) {
                    Some(Ok(t)) => row["counters"] = t.json(),
                    Some(Err(e)) => row["error"] = json!(e.to_string()),
                    None => {}
                }
                row
            })
            .collect();
        println!("{}", json!({"cluster": true, "node": me, "slots": slots.len(), "members": rows}));
        return Ok(ExitCode::SUCCESS);
    }
    println!("cluster of {} nodes; this node: {me} ({} slots)", members.len(), slots.len());
    println!(
        "{:<14} {:<22} {:<8} {:>9} {:>10} {:>10} {:>10} {:>7} {:>9} {:>10} {:>7} {:>7}",
        "node",
        "address",
        "state",
        "since",
        "from SSD",
        "from peers",
        "origin",
        "errors",
        "fallbacks",
        "served",
        "refused",
        "forged"
    );
    for m in members.values() {
        let since = if m.since_ms <= 0 { "-".to_string() } else { ago(m.since_ms) };
        let counters = match totals.get(&m.id) {
            Some(Ok(t)) => format!(
                "{:>10} {:>10} {:>10} {:>7} {:>9} {:>10} {:>7} {:>7}",
                format_size(t.bytes_from_cache),
                format_size(t.bytes_from_peers),
                format_size(t.bytes_from_origin),
                t.peer_errors,
                t.fallbacks,
                format_size(t.served_bytes),
                t.refused_connections + t.refused_requests,
                t.forged_frames
            ),
            Some(Err(e)) => format!("(counters unavailable: {e})"),
            None => String::new(),
        };
        println!("{:<14} {:<22} {:<8} {:>9} {counters}", m.id, m.address, state_name(m.state), since);
    }
    Ok(ExitCode::SUCCESS)
}

/// The other members' counters, each summed over its slots (or why they could not be read).
fn remote_totals(
    cfg: &FleetConfig,
    me: &str,
    members: Vec<&MemberStatus>,
) -> Result<BTreeMap<String, std::result::Result<Totals, PeerError>>> {
    let mut out = BTreeMap::new();
    if members.is_empty() {
        return Ok(out);
    }
    // The fleet's own settings (it may have been started with flags this command was not given).
    let fleet =
        FleetConfig::load(&cfg.fleet_file()).with_context(|| cfg.fleet_file().display().to_string())?;
    let Some(settings) = &fleet.cluster else { return Ok(out) };
    let plan = settings.resolve(fleet.slots)?;
    let peers = PeerClient::new(me, plan.secret.clone(), plan.connect_timeout, plan.peer_timeout);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    for m in members {
        let member =
            memarts_proxy::cluster::Member { id: m.id.clone(), address: m.address.clone(), weight: m.weight };
        let totals = rt.block_on(async {
            let slots = peers.remote_slots(&member).await?;
            let mut t = Totals::default();
            for slot in 0..slots {
                t.add(&peers.status(&member, slot).await?);
            }
            Ok::<_, PeerError>(t)
        });
        out.insert(m.id.clone(), totals);
    }
    Ok(out)
}

fn ago(since_ms: i64) -> String {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
    let secs = (now - since_ms).max(0) / 1000;
    match secs {
        0..=119 => format!("{secs}s ago"),
        120..=7199 => format!("{}m ago", secs / 60),
        _ => format!("{}h ago", secs / 3600),
    }
}
