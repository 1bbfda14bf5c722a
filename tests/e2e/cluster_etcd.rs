//! The cluster pool with etcd membership (elastic jobs), against a real etcd on 127.0.0.1: a node
//! that joins mid-epoch becomes an owner, a node whose lease expires is routed around, and etcd
//! restarted under load fails no read.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::cluster::Cluster;
use crate::common::etcd::Etcd;
use crate::common::{moto, pattern};

const CS: u64 = 64 << 10;
const QUICK: &str =
    "peer_timeout_secs = 2.0\nconnect_timeout_secs = 1.0\nsuspect_secs = 0.5\nlease_ttl_secs = 2.0\n";

fn dataset(bucket: &str, objects: usize, seed: u64) -> Arc<Vec<(String, Vec<u8>)>> {
    Arc::new(
        (0..objects)
            .map(|i| {
                let data = pattern(seed + i as u64, (1 + i % 3) * CS as usize + 11 * i);
                moto().put(bucket, &format!("e/{i:03}"), &data);
                (format!("s3://{bucket}/e/{i:03}"), data)
            })
            .collect(),
    )
}

/// Every member node `i` sees, by id, and its state.
fn states(cluster: &Cluster, i: usize) -> Vec<(String, String)> {
    let status = cluster.status(i);
    status["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["id"].as_str().unwrap().to_string(), m["state"].as_str().unwrap().to_string()))
        .collect()
}

fn wait_for(what: &str, within: Duration, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !ok() {
        assert!(Instant::now() < deadline, "never: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Readers on `nodes` (2 each) until `stop`, every byte verified; each returns its read count.
fn readers(
    cluster: &Cluster,
    nodes: &[usize],
    data: &Arc<Vec<(String, Vec<u8>)>>,
    stop: &Arc<AtomicBool>,
) -> Vec<std::thread::JoinHandle<usize>> {
    let mut out = Vec::new();
    for &node in nodes {
        let client = Arc::new(cluster.client(node, CS));
        for r in 0..2 {
            let (client, data, stop) = (client.clone(), data.clone(), stop.clone());
            out.push(std::thread::spawn(move || {
                let mut k = r * 5;
                let mut n = 0;
                while !stop.load(Ordering::SeqCst) {
                    let (url, want) = &data[k % data.len()];
                    let got = client.read(url).unwrap_or_else(|e| panic!("node {node}: {url}: {e}"));
                    assert!(got == *want, "node {node}: {url}: wrong bytes");
                    k += 1;
                    n += 1;
                }
                n
            }));
        }
    }
    out
}

/// Every one of `nodes` reads the whole dataset once, every byte verified: each chunk is then on
/// its owner's SSD, however slowly the machine runs.
fn read_whole(cluster: &Cluster, nodes: &[usize], data: &[(String, Vec<u8>)]) {
    for &i in nodes {
        let client = cluster.client(i, CS);
        for (url, want) in data {
            assert!(client.read(url).unwrap() == *want, "node {i}: {url}: wrong bytes");
        }
    }
}

fn join_all(stop: &AtomicBool, threads: Vec<std::thread::JoinHandle<usize>>) -> usize {
    stop.store(true, Ordering::SeqCst);
    threads.into_iter().map(|t| t.join().expect("a reader failed")).sum()
}

#[test]
fn a_node_joining_mid_epoch_becomes_an_owner_and_one_whose_lease_expires_is_routed_around() {
    let etcd = Etcd::start();
    let bucket = moto().bucket("etcd-join");
    let data = dataset(&bucket, 30, 700);
    let cluster = Cluster::with_etcd(3, 2, &etcd.endpoint(), "job-join", QUICK);
    cluster.start_node(0);
    cluster.start_node(1);
    wait_for("a and b see each other", Duration::from_secs(10), || states(&cluster, 0).len() == 2);

    let stop = Arc::new(AtomicBool::new(false));
    let running = readers(&cluster, &[0, 1], &data, &stop);
    std::thread::sleep(Duration::from_millis(500));
    cluster.start_node(2);
    wait_for("a sees c alive", Duration::from_secs(10), || {
        states(&cluster, 0).iter().any(|(id, s)| id == "node-c" && s == "alive")
    });
    std::thread::sleep(Duration::from_millis(1500));
    assert!(join_all(&stop, running) > 0);
    // Node c owns a third of the chunks now: the other nodes read them from it.
    let before = cluster.counter(0, 2, "served_chunks");
    let stop = Arc::new(AtomicBool::new(false));
    let running = readers(&cluster, &[0, 1], &data, &stop);
    std::thread::sleep(Duration::from_secs(1));
    join_all(&stop, running);
    assert!(cluster.counter(0, 2, "served_chunks") > before, "node c serves none of the chunks it owns");

    // Node c dies: its lease expires and the others route around it; no read fails.
    let stop = Arc::new(AtomicBool::new(false));
    let running = readers(&cluster, &[0, 1], &data, &stop);
    cluster.signal(2, nix::sys::signal::Signal::SIGKILL);
    wait_for("a sees c down (its lease expired)", Duration::from_secs(15), || {
        states(&cluster, 0).iter().any(|(id, s)| id == "node-c" && s == "down")
    });
    std::thread::sleep(Duration::from_millis(500));
    assert!(join_all(&stop, running) > 0);
    // Still registered: ownership follows the registered members, so c's chunks wait for it.
    assert!(states(&cluster, 1).iter().any(|(id, _)| id == "node-c"));
}

#[test]
fn etcd_restarted_under_load_fails_no_read_and_keeps_the_members() {
    let mut etcd = Etcd::start();
    let bucket = moto().bucket("etcd-restart");
    let data = dataset(&bucket, 24, 800);
    let cluster = Cluster::with_etcd(3, 1, &etcd.endpoint(), "job-restart", QUICK);
    for i in 0..3 {
        cluster.start_node(i);
    }
    wait_for("every node sees three alive", Duration::from_secs(10), || {
        (0..3).all(|i| {
            let s = states(&cluster, i);
            s.len() == 3 && s.iter().all(|(_, state)| state == "alive")
        })
    });
    read_whole(&cluster, &[0, 1, 2], &data);
    let gets = moto().gets_settled(&bucket);

    let stop = Arc::new(AtomicBool::new(false));
    let running = readers(&cluster, &[0, 1, 2], &data, &stop);
    etcd.kill();
    std::thread::sleep(Duration::from_secs(3));
    // With etcd away, nobody was dropped: the last roster stands.
    for i in 0..3 {
        assert!(states(&cluster, i).iter().all(|(_, s)| s == "alive"), "node {i}: {:?}", states(&cluster, i));
    }
    etcd.spawn();
    std::thread::sleep(Duration::from_secs(3));
    assert!(join_all(&stop, running) > 0);
    for i in 0..3 {
        let s = states(&cluster, i);
        assert!(
            s.len() == 3 && s.iter().all(|(_, state)| state == "alive"),
            "node {i} after the restart: {s:?}"
        );
    }
    // Nothing moved: the warm dataset was read without a single origin GET throughout.
    assert_eq!(moto().gets_settled(&bucket), gets, "reads went to the origin while etcd restarted");
}

#[test]
fn with_etcd_unreachable_a_node_refuses_to_start_unless_told_to_start_from_the_last_known_members() {
    let mut etcd = Etcd::start();
    let bucket = moto().bucket("etcd-last");
    let data = dataset(&bucket, 12, 900);
    let cluster = Cluster::with_etcd(
        2,
        1,
        &etcd.endpoint(),
        "job-last",
        &format!("{QUICK}start_from_last_known = true\n"),
    );
    cluster.start_node(0);
    cluster.start_node(1);
    wait_for("a and b see each other", Duration::from_secs(10), || states(&cluster, 0).len() == 2);
    read_whole(&cluster, &[0, 1], &data);
    let gets = moto().gets_settled(&bucket);

    // Both nodes restart while etcd is down: they start from the members they saved, and serve
    // each other as before (nothing more from the origin).
    etcd.kill();
    for node in &cluster.nodes {
        node.stop_proxy();
    }
    cluster.start_node(0);
    cluster.start_node(1);
    assert_eq!(states(&cluster, 0).len(), 2, "node a did not start from the last known members");
    let stop = Arc::new(AtomicBool::new(false));
    let running = readers(&cluster, &[0, 1], &data, &stop);
    std::thread::sleep(Duration::from_millis(800));
    assert!(join_all(&stop, running) > 0);
    assert_eq!(moto().gets_settled(&bucket), gets, "reads went to the origin after the restart");

    // Without the option, a node does not start blind: a clear error naming etcd.
    let plain = Cluster::with_etcd(1, 1, &etcd.endpoint(), "job-last-plain", QUICK);
    let out = plain.nodes[0].memarts(&["start_proxy", "1"]);
    assert!(!out.status.success(), "a node started with etcd unreachable");
    let err = crate::common::text(&out.stderr);
    assert!(err.contains(&etcd.endpoint()) && err.contains("did not answer"), "{err}");
}
