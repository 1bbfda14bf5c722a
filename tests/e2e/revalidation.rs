//! Expired metadata revalidated by listing the objects' directories (issue 29): a warm epoch that
//! starts after the metadata TTL asks the origin once per directory page, not once per object; an
//! object replaced at the origin is read new, never mixed; a listing that fails falls back to
//! HEADs with no failed read.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::fault_relay::{Fault, FaultRelay, Match};
use crate::common::{moto, pattern, Fleet};

const TTL: f64 = 3.0;

fn dataset(bucket: &str, dirs: usize, per_dir: usize) -> Arc<Vec<(String, Vec<u8>)>> {
    let objects: Vec<(String, Vec<u8>)> = (0..dirs * per_dir)
        .map(|i| (format!("ds/d{}/obj-{i:05}", i % dirs), pattern(77_000 + i as u64, 200 + i % 300)))
        .collect();
    moto().put_many(bucket, objects.clone());
    Arc::new(objects.into_iter().map(|(key, data)| (format!("s3://{bucket}/{key}"), data)).collect())
}

/// `threads` readers of `fleet` read every object once, each checked against `want` (the bytes the
/// origin holds now).
fn epoch(fleet: &Fleet, want: &Arc<Vec<(String, Vec<u8>)>>, threads: usize) {
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (client, want) = (fleet.client(1 << 20), want.clone());
            std::thread::spawn(move || {
                for (url, data) in want.iter().skip(t).step_by(threads) {
                    let got = client.read(url).unwrap_or_else(|e| panic!("{url}: {e}"));
                    assert!(got == *data, "{url}: not the bytes the origin holds");
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("a reader failed");
    }
}

fn heads_and_lists(bucket: &str) -> (usize, usize) {
    // Settle moto's log first (it is read by a thread).
    moto().gets_settled(bucket);
    (moto().requests(&format!("HEAD /{bucket}/")), moto().requests(&format!("GET /{bucket}?")))
}

#[test]
fn a_warm_epoch_after_the_ttl_lists_each_directory_once_and_reads_replaced_objects_new() {
    let bucket = moto().bucket("relist");
    let mut data = dataset(&bucket, 3, 1000);
    let config = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(config.path(), format!("meta_ttl_secs = {TTL}\n")).unwrap();
    let fleet = Fleet::start(4, &[("MEMARTS_CONFIG", config.path().to_str().unwrap())]);
    fleet.wait_index_ready();
    let started = Instant::now();
    epoch(&fleet, &data, 8);
    eprintln!("epoch 1: {:?}", started.elapsed());
    // Past the TTL of the last object read: every object's metadata has expired. Two objects of
    // each directory change.
    std::thread::sleep(Duration::from_secs_f64(TTL + 0.5));
    let replaced: Vec<usize> = vec![5, 1400, 2999, 7, 1501, 2];
    let mut now = (*data).clone();
    for &i in &replaced {
        now[i].1 = pattern(99_000 + i as u64, 333);
        moto().put(&bucket, now[i].0.trim_start_matches(&format!("s3://{bucket}/")), &now[i].1);
    }
    data = Arc::new(now);
    let (heads, lists) = heads_and_lists(&bucket);
    let gets = moto().gets_settled(&bucket);
    let epoch2 = Instant::now();
    epoch(&fleet, &data, 8);
    eprintln!("epoch 2: {:?}", epoch2.elapsed());
    assert!(
        epoch2.elapsed() < Duration::from_secs_f64(TTL),
        "epoch 2 outlived the TTL: {:?}",
        epoch2.elapsed()
    );
    let (heads2, lists2) = heads_and_lists(&bucket);
    let (new_heads, new_lists) = (heads2 - heads, lists2 - lists);
    assert!(
        new_heads + new_lists <= 3,
        "3,000 objects in 3 directories revalidated with {new_heads} HEADs and {new_lists} LISTs"
    );
    assert!(new_lists >= 1, "no directory was listed");
    // The replaced objects were fetched again (one GET each: their new chunk 0), nothing else.
    assert_eq!(moto().gets_settled(&bucket) - gets, replaced.len(), "GETs of epoch 2");
}

#[test]
fn a_listing_that_fails_falls_back_to_heads_with_no_failed_read() {
    let relay = FaultRelay::start(&moto().endpoint);
    let bucket = moto().bucket("relist-503");
    let data = dataset(&bucket, 1, 60);
    let (_cfg, fleet) = relay.fleet(2, &format!("meta_ttl_secs = {TTL}"), &[]);
    fleet.wait_index_ready();
    epoch(&fleet, &data, 4);
    std::thread::sleep(Duration::from_secs_f64(TTL + 0.5));
    // Every attempt of the first listing is refused (6 attempts, the origin's retries included).
    let list = Match { method: Some("GET"), ranged: false, path_contains: Some("list-type".into()) };
    let injected = relay.injected();
    relay.inject(list, Fault::Status(503), 6);
    let (heads, _) = heads_and_lists(&bucket);
    epoch(&fleet, &data, 4);
    assert_eq!(relay.injected() - injected, 6, "the listing was not asked for");
    let (heads2, _) = heads_and_lists(&bucket);
    assert!(heads2 > heads, "no object was revalidated with a HEAD after the listing failed");
}

/// The same in a pool of 3 nodes: each directory is listed once for the pool (by the node that owns
/// it), not once per node.
#[test]
fn in_a_pool_each_directory_is_listed_once_not_once_per_node() {
    let bucket = moto().bucket("relist-pool");
    let data = dataset(&bucket, 3, 300);
    let config = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(config.path(), format!("meta_ttl_secs = {TTL}\n")).unwrap();
    let cluster = crate::common::cluster::Cluster::start(
        3,
        2,
        "",
        &[("MEMARTS_CONFIG", config.path().to_str().unwrap())],
    );
    let read_everywhere = |data: &Arc<Vec<(String, Vec<u8>)>>| {
        let handles: Vec<_> = (0..3)
            .map(|node| {
                let (client, data) = (cluster.client(node, 1 << 20), data.clone());
                std::thread::spawn(move || {
                    for (url, want) in data.iter() {
                        assert!(client.read(url).unwrap_or_else(|e| panic!("{url}: {e}")) == *want, "{url}");
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().expect("a node's reader failed");
        }
    };
    read_everywhere(&data);
    std::thread::sleep(Duration::from_secs_f64(TTL + 0.5));
    let (heads, lists) = heads_and_lists(&bucket);
    let started = Instant::now();
    read_everywhere(&data);
    assert!(started.elapsed() < Duration::from_secs_f64(TTL), "epoch 2 outlived the TTL");
    let (heads2, lists2) = heads_and_lists(&bucket);
    let (new_heads, new_lists) = (heads2 - heads, lists2 - lists);
    assert!(
        new_heads + new_lists <= 3,
        "3 nodes revalidated 900 objects in 3 directories with {new_heads} HEADs and {new_lists} LISTs"
    );
}
