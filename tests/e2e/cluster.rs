//! The cluster pool end to end: several nodes' fleets (real proxy processes, peer listeners on their
//! own loopback addresses) over one moto origin that counts GETs. C1–C3 and S6 of docs/RELIABILITY.md.

use std::sync::Arc;

use crate::common::cluster::Cluster;
use crate::common::{moto, pattern};

const CS: u64 = 64 << 10;

/// A dataset of `objects` objects of 1 to 4 chunks and a bit; returns (url, bytes) pairs.
fn dataset(bucket: &str, objects: usize, seed: u64) -> Vec<(String, Arc<Vec<u8>>)> {
    (0..objects)
        .map(|i| {
            let len = (1 + i % 4) * CS as usize + 17 * i;
            let data = pattern(seed + i as u64, len);
            moto().put(bucket, &format!("ds/{i:04}"), &data);
            (format!("s3://{bucket}/ds/{i:04}"), Arc::new(data))
        })
        .collect()
}

fn chunks(data: &[(String, Arc<Vec<u8>>)]) -> usize {
    data.iter().map(|(_, d)| (d.len() as u64).div_ceil(CS) as usize).sum()
}

/// Every node's `readers` threads read the whole dataset at once, each verifying every byte.
fn read_everywhere(cluster: &Cluster, data: &[(String, Arc<Vec<u8>>)], readers: usize) {
    let data = Arc::new(data.to_vec());
    let barrier = Arc::new(std::sync::Barrier::new(cluster.nodes.len() * readers));
    let mut threads = Vec::new();
    for node in 0..cluster.nodes.len() {
        let client = Arc::new(cluster.client(node, CS));
        for r in 0..readers {
            let (client, data, barrier) = (client.clone(), data.clone(), barrier.clone());
            threads.push(std::thread::spawn(move || {
                barrier.wait();
                // Each reader starts at another object, so the cold misses meet at every chunk.
                for k in 0..data.len() {
                    let (url, want) = &data[(k + r) % data.len()];
                    let got =
                        client.read(url).unwrap_or_else(|e| panic!("node {node} reader {r}: {url}: {e}"));
                    assert!(got == **want, "node {node} reader {r}: {url}: wrong bytes");
                }
            }));
        }
    }
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn three_nodes_reading_one_cold_dataset_fetch_each_chunk_once_in_the_cluster() {
    let bucket = moto().bucket("pool");
    let data = dataset(&bucket, 24, 100);
    let cluster = Cluster::start(3, 2, "", &[]);
    read_everywhere(&cluster, &data, 8);
    let gets = moto().gets_settled(&bucket);
    if gets != chunks(&data) {
        let repeated = cluster.repeated_gets();
        let failures = cluster.log_lines("peer read failed");
        let rebuilt = cluster.log_lines("index rebuilt");
        panic!(
            "{gets} origin GETs for {} chunks in the whole cluster; the same bytes asked more than once: \
             {repeated:#?}\npeer read failures: {failures:#?}\nindex rebuilds: {rebuilt:#?}",
            chunks(&data)
        );
    }
    // Each node served about a third from its own SSD or the origin, and read the rest from peers.
    for i in 0..3 {
        let from_peers = cluster.counter(i, i, "bytes_from_peers");
        assert!(from_peers > 0, "node {i} read nothing from its peers");
        assert!(cluster.counter(0, i, "served_bytes") > 0, "node {i} served nothing to its peers");
    }
    // A warm epoch anywhere costs no origin request.
    read_everywhere(&cluster, &data, 2);
    assert_eq!(moto().gets_settled(&bucket), chunks(&data), "a warm epoch reached the origin");
}

/// Reads the dataset on every node in the background until `stop`, verifying every byte; returns
/// the threads (each yields its count of reads) to join.
fn keep_reading(
    cluster: &Cluster,
    nodes: &[usize],
    data: &[(String, Arc<Vec<u8>>)],
    stop: &Arc<std::sync::atomic::AtomicBool>,
) -> Vec<std::thread::JoinHandle<usize>> {
    let data = Arc::new(data.to_vec());
    let mut threads = Vec::new();
    for &node in nodes {
        let client = Arc::new(cluster.client(node, CS));
        for r in 0..2 {
            let (client, data, stop) = (client.clone(), data.clone(), stop.clone());
            threads.push(std::thread::spawn(move || {
                let mut reads = 0;
                let mut k = r * 7;
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    let (url, want) = &data[k % data.len()];
                    let got = client.read(url).unwrap_or_else(|e| panic!("node {node}: {url}: {e}"));
                    assert!(got == **want, "node {node}: {url}: wrong bytes");
                    reads += 1;
                    k += 1;
                }
                reads
            }));
        }
    }
    threads
}

fn stop_and_join(
    stop: &Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<usize>>,
) -> usize {
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    threads.into_iter().map(|t| t.join().expect("a reader failed")).sum()
}

/// Short peer deadlines, so that a dead or hung node is routed around quickly.
const QUICK: &str = "peer_timeout_secs = 1.0\nconnect_timeout_secs = 0.5\nsuspect_secs = 0.5\n";

#[test]
fn kill_9_of_a_whole_node_fails_no_read_elsewhere_and_it_comes_back_warm() {
    use nix::sys::signal::Signal;
    let bucket = moto().bucket("pool-kill");
    let data = dataset(&bucket, 24, 200);
    let cluster = Cluster::start(3, 2, QUICK, &[]);
    read_everywhere(&cluster, &data, 1);
    // (Exactly one GET per chunk is the first test's; here the short peer deadline may, on a loaded
    // machine, send a slow owner's chunk to the origin once more.)
    let warm = moto().gets_settled(&bucket);

    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers = keep_reading(&cluster, &[0, 2], &data, &stop);
    std::thread::sleep(std::time::Duration::from_millis(300));
    cluster.signal(1, Signal::SIGKILL);
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let reads = stop_and_join(&stop, readers);
    assert!(reads > 0);
    // Node b's share was fetched once by its next owners, not once per node and read.
    let during = moto().gets_settled(&bucket) - warm;
    let share = chunks(&data) / 3;
    assert!(during <= 2 * share, "{during} GETs while node b was down, its share is about {share}");
    let status = cluster.status(0);
    let b = status["members"].as_array().unwrap().iter().find(|m| m["id"] == "node-b").unwrap().clone();
    assert_ne!(b["state"], "alive", "node a did not notice node b is gone: {b}");

    // Back, warm: its SSD still holds its chunks, so an epoch everywhere reaches the origin for none.
    cluster.nodes[1].stop_proxy();
    cluster.start_node(1);
    let before = moto().gets_settled(&bucket);
    read_everywhere(&cluster, &data, 1);
    assert_eq!(moto().gets_settled(&bucket), before, "an epoch after node b came back reached the origin");
}

#[test]
fn a_hung_node_is_routed_around_and_a_blip_fetches_nothing_again_afterwards() {
    use nix::sys::signal::Signal;
    let bucket = moto().bucket("pool-hang");
    let data = dataset(&bucket, 24, 300);
    let cluster = Cluster::start(3, 2, QUICK, &[]);
    read_everywhere(&cluster, &data, 1);

    // Hung, not dead: connections are accepted by the kernel and never answered.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers = keep_reading(&cluster, &[0, 2], &data, &stop);
    cluster.signal(1, Signal::SIGSTOP);
    let started = std::time::Instant::now();
    std::thread::sleep(std::time::Duration::from_secs(2));
    cluster.signal(1, Signal::SIGCONT);
    let reads = stop_and_join(&stop, readers);
    assert!(reads > 0, "no read completed in {:?} while node b hung", started.elapsed());

    // The blip is over: node b owns and serves its chunks again, so nothing is fetched a second time.
    cluster.wait_all_alive(0);
    cluster.wait_all_alive(2);
    let before = moto().gets_settled(&bucket);
    read_everywhere(&cluster, &data, 1);
    assert_eq!(moto().gets_settled(&bucket), before, "an epoch after the blip reached the origin");
}

#[test]
fn a_dataset_larger_than_one_node_is_served_warm_by_three() {
    let bucket = moto().bucket("pool-big");
    // 160 MiB of 1 MiB objects on nodes of 64 MiB each: 2.5 times one node.
    let objects: Vec<(String, Arc<Vec<u8>>)> = (0..160)
        .map(|i| {
            let data = pattern(400 + i, 1 << 20);
            moto().put(&bucket, &format!("big/{i:04}"), &data);
            (format!("s3://{bucket}/big/{i:04}"), Arc::new(data))
        })
        .collect();
    let cluster = Cluster::start(3, 2, "", &[("MEMARTS_CACHE_CAPACITY", "64MiB")]);
    read_everywhere(&cluster, &objects, 1);
    let cold = moto().gets_settled(&bucket);
    read_everywhere(&cluster, &objects, 1);
    let epoch2 = moto().gets_settled(&bucket) - cold;
    let reads = 3 * chunks(&objects);
    assert!(epoch2 * 20 <= reads, "epoch 2 made {epoch2} origin GETs for {reads} chunk reads (over 5%)");
    for i in 0..3 {
        let used: u64 = cluster.nodes[i].total("cache_bytes_used");
        assert!(used <= 64 << 20, "node {i} holds {used} bytes, over its capacity");
    }
}

#[test]
fn strangers_wrong_secrets_garbage_and_idle_crowds_on_the_peer_port_are_refused_and_members_keep_reading() {
    use memarts_proxy::cluster::auth::Secret;
    use memarts_proxy::cluster::peer_client::{PeerClient, PeerError};
    use memarts_proxy::cluster::Member;
    use std::io::{Read, Write};

    let bucket = moto().bucket("pool-sec");
    let data = dataset(&bucket, 12, 500);
    let cluster = Cluster::start(2, 1, "", &[]);
    let port = cluster.addresses[0].clone();
    let refused_before = cluster.counter(0, 0, "refused_connections");

    // A client with the wrong secret (and the right node id) is refused with a typed answer.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let wrong = PeerClient::new(
        "node-b",
        Secret::new(b"not the cluster secret at all").unwrap(),
        std::time::Duration::from_secs(2),
        std::time::Duration::from_secs(2),
    );
    let a = Member { id: "node-a".into(), address: port.clone(), weight: 1.0 };
    match rt.block_on(wrong.remote_slots(&a)) {
        Err(PeerError::Unreachable { why, .. }) => assert!(why.contains("did not prove"), "{why}"),
        other => panic!("a wrong secret got {other:?}"),
    }
    // Garbage, an oversized frame and a byte-a-second client get nothing and are closed.
    let to = port.clone();
    let send_raw = move |bytes: &[u8], pause: Option<std::time::Duration>| {
        let mut s = std::net::TcpStream::connect(&to).unwrap();
        s.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
        let mut challenge = [0u8; 64];
        let _ = s.read(&mut challenge);
        for b in bytes {
            if s.write_all(std::slice::from_ref(b)).is_err() {
                break;
            }
            if let Some(p) = pause {
                std::thread::sleep(p);
            }
        }
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
        rest
    };
    let garbage: Vec<u8> = (0..300u32).map(|i| (i * 31 % 251) as u8).collect();
    let answer = send_raw(&garbage, None);
    assert!(!answer.windows(9).any(|w| w == b"node-a\0\0\0"), "garbage was welcomed");
    let mut oversized = vec![0xff, 0xff, 0xff, 0x7f, 0, 0, 0, 0];
    oversized.extend_from_slice(&[0u8; 32]);
    send_raw(&oversized, None);
    // 1,000 connections that never speak, and members keep being served meanwhile.
    let idle: Vec<std::net::TcpStream> =
        (0..1000).filter_map(|_| std::net::TcpStream::connect(&port).ok()).collect();
    read_everywhere(&cluster, &data, 2);
    let slow = std::thread::spawn(move || {
        send_raw(&[1, 2, 3, 4, 5, 6, 7, 8], Some(std::time::Duration::from_secs(1)))
    });
    drop(idle);
    slow.join().unwrap();
    assert_eq!(moto().gets_settled(&bucket), chunks(&data));
    let refused = cluster.counter(0, 0, "refused_connections") - refused_before;
    assert!(refused >= 3, "refused connections not counted: {refused}");
}

#[test]
fn an_object_replaced_while_every_node_reads_it_is_never_served_mixed() {
    let bucket = moto().bucket("pool-replace");
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("fleet.toml");
    std::fs::write(&config, "meta_ttl_secs = 0.2\n").unwrap();
    let versions: Arc<std::sync::Mutex<Vec<Vec<u8>>>> = Arc::default();
    let put = |v: u64| {
        let data = pattern(600 + v, 6 * CS as usize + 5);
        moto().put(&bucket, "moving", &data);
        versions.lock().unwrap().push(data);
    };
    put(0);
    let cluster = Cluster::start(3, 2, "", &[("MEMARTS_CONFIG", config.to_str().unwrap())]);
    let url = format!("s3://{bucket}/moving");
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut readers = Vec::new();
    for node in 0..3 {
        let client = Arc::new(cluster.client(node, CS));
        for _ in 0..2 {
            let (client, url, versions, stop) = (client.clone(), url.clone(), versions.clone(), stop.clone());
            readers.push(std::thread::spawn(move || {
                let (mut whole, mut stale) = (0, 0);
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    match client.read(&url) {
                        Ok(got) => {
                            assert!(
                                versions.lock().unwrap().contains(&got),
                                "node {node}: a mix of versions"
                            );
                            whole += 1;
                        }
                        Err(memarts_shim::Error::Stale(_)) => stale += 1,
                        Err(e) => panic!("node {node}: {e}"),
                    }
                }
                (whole, stale)
            }));
        }
    }
    for v in 1..12 {
        std::thread::sleep(std::time::Duration::from_millis(150));
        put(v);
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let whole: usize = readers.into_iter().map(|r| r.join().expect("a reader failed").0).sum();
    assert!(whole > 0);
}

#[test]
fn start_proxy_refuses_a_bad_cluster_configuration_naming_what_is_wrong() {
    use std::os::unix::fs::PermissionsExt;
    let cluster = crate::common::cluster::Cluster::new(2, 1, "", &[]);
    // An id the file does not list.
    let out = cluster.nodes[0].memarts(&["start_proxy", "1", "--node", "node-z"]);
    let err = crate::common::text(&out.stderr);
    assert!(!out.status.success() && err.contains("\"node-z\" is not in its [[nodes]]"), "{err}");
    // A secret others can read.
    let secret = cluster.dir.path().join("cluster.secret");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = cluster.nodes[0].memarts(&["start_proxy", "1"]);
    let err = crate::common::text(&out.stderr);
    assert!(!out.status.success() && err.contains("readable by other users"), "{err}");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    // A peer port another process holds.
    let port = cluster.addresses[0].clone();
    let _squatter = std::net::TcpListener::bind(&port).unwrap();
    let out = cluster.nodes[0].memarts(&["start_proxy", "1"]);
    let err = crate::common::text(&out.stderr);
    assert!(!out.status.success() && err.contains("peer listener") && err.contains(&port), "{err}");
}
