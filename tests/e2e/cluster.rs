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
    assert_eq!(moto().gets_settled(&bucket), chunks(&data), "origin GETs != chunks in the whole cluster");
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
