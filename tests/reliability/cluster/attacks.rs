//! The pool's trust boundary under attack (S7, S8 of docs/RELIABILITY.md), while members read:
//!
//! - a hostile member, which holds the cluster secret: reads of local paths (refused, counted),
//!   chunk sizes out of bounds, `recheck` of cached chunks (ignored: nothing dropped or refetched),
//!   then requests for a 16 MiB chunk on many connections whose replies it never reads (the slot's
//!   memory grows by no more than its budget for replies to peers);
//! - an on-path attacker in front of one node's peer ports (`common/peer_relay.rs`) that flips,
//!   replays, reorders and injects records: each attack is detected as a forged record, the reads it
//!   met are routed around, and its capture of the traffic holds no piece of the data.

use std::time::{Duration, Instant};

use memarts_protocol::peer::PeerRequest;
use memarts_protocol::{ChunkRequest, ErrorCode, FirstRequest, ObjectUrl};
use memarts_proxy::cluster::auth::Secret;
use memarts_proxy::cluster::peer_client::{PeerClient, PeerError};
use memarts_proxy::cluster::Member;
use rand::{Rng, SeedableRng};

use super::{dataset, node_counter, pool_counter, slots, Readers, NODES, TIMEOUTS};
use crate::common::cluster::{free_ports, Cluster};
use crate::common::moto;
use crate::common::peer_relay::{holds_plaintext, PeerRelay, ATTACKS};
use crate::common::raw::proc_kib;
use crate::report::Row;
use crate::Scale;

/// The slots' memory budget in this row (half of it for replies to peers), and how much more a
/// slot's resident memory may grow while replies wait for a member that does not read them.
const BUDGET: u64 = 64 << 20;
const RSS_GROWTH_CAP: u64 = 96 << 20;
const BIG: u64 = 16 << 20;

fn member_of(cluster: &Cluster, i: usize) -> Member {
    Member { id: cluster.ids[i].clone(), address: cluster.addresses[i].clone(), weight: 1.0 }
}

fn hostile_client(cluster: &Cluster, as_node: usize) -> PeerClient {
    let secret = std::fs::read(cluster.dir.path().join("cluster.secret")).unwrap();
    PeerClient::new(
        &cluster.ids[as_node],
        Secret::new(&secret).unwrap(),
        Duration::from_secs(2),
        Duration::from_secs(10),
    )
}

pub fn hostile_member(scale: Scale) -> Row {
    let mut row = Row::new(
        "cluster",
        "a hostile member: local paths, bad chunk sizes, recheck, replies it never reads",
    );
    let started = Instant::now();
    let data = dataset("pool-member", scale, 35);
    let config = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(config.path(), format!("memory_budget = {BUDGET}\n")).unwrap();
    let cluster =
        Cluster::start(NODES, slots(scale), TIMEOUTS, &[("MEMARTS_CONFIG", config.path().to_str().unwrap())]);
    let readers = Readers::start(&cluster, &data, scale);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let hostile = hostile_client(&cluster, 1);
    let target = member_of(&cluster, 0);
    let mut rng = rand::rngs::StdRng::seed_from_u64(36);
    let local =
        ["/etc/passwd", "file:///etc/shadow", "/proc/self/environ", "/root/.ssh/id_rsa", "/tmp/../etc/hosts"];
    let secret_path = cluster.dir.path().join("cluster.secret").display().to_string();
    let (mut locals, mut rechecks, mut bad_sizes) = (0u64, 0u64, 0u64);
    let until = Instant::now() + Duration::from_secs(scale.pick(8, 45));
    let corrupt = |c: &Cluster| (0..NODES).map(|i| c.nodes[i].total("corrupt_chunks")).sum::<u64>();
    let corrupt_before = corrupt(&cluster);
    while Instant::now() < until {
        row.injected += 1;
        match rng.random_range(0..3) {
            0 => {
                locals += 1;
                let url = if rng.random_bool(0.2) {
                    secret_path.clone()
                } else {
                    local[rng.random_range(0..local.len())].to_string()
                };
                let first = FirstRequest { url: url.clone(), chunk_size: 1 << 20, refresh: true };
                match rt.block_on(hostile.read_first(&target, &first)) {
                    Err(PeerError::Answer(e)) if e.code == ErrorCode::PermissionDenied => {}
                    Ok(_) => row.violate(format!("a member was served the local file {url}")),
                    Err(e) => row.violate(format!("{url}: not a typed refusal: {e}")),
                }
            }
            1 => {
                bad_sizes += 1;
                let chunk_size = if rng.random_bool(0.5) { 0 } else { 1 << 40 };
                let req = ChunkRequest {
                    url: data.url(rng.random_range(0..data.objects.len())),
                    etag: "\"x\"".into(),
                    object_size: 1 << 20,
                    chunk_size,
                    index: 0,
                    recheck: false,
                };
                if let Ok(f) = rt.block_on(hostile.read_chunk(&target, &req)) {
                    row.violate(format!("a chunk of size {chunk_size} was served ({} bytes)", f.data.len()));
                }
            }
            _ => {
                // A recheck of a chunk the pool has: served, and nothing dropped.
                rechecks += 1;
                let i = rng.random_range(0..data.objects.len());
                let first = FirstRequest { url: data.url(i), chunk_size: super::CS, refresh: false };
                let Ok(first) = rt.block_on(hostile.read_first(&target, &first)) else { continue };
                let req = ChunkRequest {
                    url: data.url(i),
                    etag: first.meta.etag.unwrap_or_default(),
                    object_size: first.meta.size,
                    chunk_size: super::CS,
                    index: 0,
                    recheck: true,
                };
                match rt.block_on(hostile.read_chunk(&target, &req)) {
                    Ok(f) if f.data[..] == data.objects[i].1[..f.data.len()] => {}
                    Ok(_) => row.violate("a recheck was answered with wrong bytes"),
                    Err(e) => row.violate(format!("a recheck failed: {e}")),
                }
            }
        }
    }
    let refused = pool_counter(&cluster, "refused_requests");
    if refused != locals {
        row.violate(format!("{locals} local reads sent, {refused} refused and counted"));
    }
    let dropped = corrupt(&cluster) - corrupt_before;
    if dropped > 0 {
        row.violate(format!("{rechecks} rechecks from a member dropped {dropped} cached chunks"));
    }
    let growth = replies_never_read(&cluster, &rt, &hostile, &mut row);
    let calls = readers.finish(&mut row);
    row.detected = refused + bad_sizes + rechecks;
    row.note = format!(
        "injected = a member's hostile requests ({locals} local paths and the secret file, {bad_sizes} chunk sizes of 0 \
         or 1 TiB, {rechecks} rechecks of cached chunks) and 48 requests for a 16 MiB chunk it never read; \
         detected = local reads refused and counted ({refused}), bad sizes refused, rechecks answered without a \
         drop; the target slot's memory grew by {} MiB while the unread replies waited (budget for peers {} MiB); \
         {calls} reads verified on the 3 nodes meanwhile",
        growth >> 20,
        BUDGET >> 21
    );
    row.seconds = started.elapsed().as_secs_f64();
    row
}

/// 48 connections to the slot owning a 16 MiB chunk, each asking for it and never reading; returns
/// how much the slot's peak resident memory grew.
fn replies_never_read(
    cluster: &Cluster,
    rt: &tokio::runtime::Runtime,
    hostile: &PeerClient,
    row: &mut Row,
) -> u64 {
    let bucket = moto().bucket("pool-unread");
    let body: Vec<u8> = (0..BIG as usize).map(|i| (i * 131 % 251) as u8).collect();
    moto().put(&bucket, "big", &body);
    let url = format!("s3://{bucket}/big");
    let target = member_of(cluster, 0);
    let first = FirstRequest { url: url.clone(), chunk_size: BIG, refresh: false };
    let meta = match rt.block_on(hostile.read_first(&target, &first)) {
        Ok(f) => f.meta,
        Err(e) => {
            row.violate(format!("the big object could not be read: {e}"));
            return 0;
        }
    };
    let etag = meta.etag.unwrap_or_default();
    let id = memarts_protocol::chunk_id(&ObjectUrl::parse(&url).unwrap(), &etag, BIG, 0);
    let slot = memarts_protocol::owner_slot(id, cluster.slots);
    let pid = cluster.nodes[0].pid(slot) as u32;
    let before = proc_kib(pid, "VmHWM:") << 10;
    let request = PeerRequest::ReadChunk(ChunkRequest {
        url,
        etag,
        object_size: BIG,
        chunk_size: BIG,
        index: 0,
        recheck: false,
    });
    let held = rt.block_on(async {
        let mut held = Vec::new();
        for _ in 0..48 {
            if let Ok(mut sealed) = hostile.connect(&target, slot).await {
                if sealed.send(&request, &[]).await.is_ok() {
                    held.push(sealed);
                }
            }
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
        held
    });
    let growth = (proc_kib(pid, "VmHWM:") << 10).saturating_sub(before);
    drop(held);
    if growth > RSS_GROWTH_CAP {
        row.violate(format!("unread replies to a member grew the slot's memory by {} MiB", growth >> 20));
    }
    growth
}

pub fn on_path_attacker(scale: Scale) -> Row {
    let mut row =
        Row::new("cluster", "on-path attacker: flipped, replayed, reordered, injected records; a capture");
    let started = Instant::now();
    let data = dataset("pool-onpath", scale, 37);
    let mut cluster = Cluster::new(NODES, slots(scale), TIMEOUTS, &[]);
    let hidden_ip = format!("127.0.0.{}", NODES + 3);
    let hidden = format!("{hidden_ip}:{}", free_ports(std::slice::from_ref(&hidden_ip), cluster.slots));
    let victim = NODES - 1;
    cluster.nodes[victim].extra_env.push(("MEMARTS_PEER_LISTEN".into(), hidden.clone()));
    let relay = PeerRelay::start(&cluster.addresses[victim], &hidden, cluster.slots, true);
    for i in 0..NODES {
        cluster.start_node(i);
    }
    let readers = Readers::start(&cluster, &data, scale);
    std::thread::sleep(Duration::from_secs(scale.pick(12, 60)));
    let calls = readers.finish(&mut row);
    std::thread::sleep(Duration::from_millis(500));
    let fired: Vec<u64> = ATTACKS.iter().map(|a| relay.fired(*a)).collect();
    row.injected = relay.total_fired();
    row.detected = (0..NODES).map(|i| node_counter(&cluster, i, "forged_frames")).sum();
    if row.detected < row.injected {
        row.violate(format!("{} attacks fired, {} forged records detected", row.injected, row.detected));
    }
    if fired.contains(&0) {
        row.violate(format!("not every attack fired: {fired:?}"));
    }
    let parsed = node_counter(&cluster, victim, "refused_requests");
    if parsed > 0 {
        row.violate(format!("{parsed} injected requests were parsed"));
    }
    let capture = relay.capture();
    let plain: Vec<&[u8]> = data.objects.iter().map(|(_, d)| &d[..]).collect();
    if holds_plaintext(&capture, &plain) {
        row.violate("the data crossed the relay in clear");
    }
    let fallbacks: u64 = (0..victim).map(|i| node_counter(&cluster, i, "fallbacks")).sum();
    row.note = format!(
        "injected = attacks on {} connections through the relay (flipped request / reply, replayed request / reply, \
         reordered reply, injected request: {fired:?}); detected = records that failed to open, counted by the node \
         that read them; {fallbacks} reads routed around; the relay's capture ({} MiB) holds no 32-byte piece of the \
         data; {calls} reads verified on the 3 nodes",
        relay.connections(),
        capture.len() >> 20
    );
    relay.stop();
    row.seconds = started.elapsed().as_secs_f64();
    row
}
