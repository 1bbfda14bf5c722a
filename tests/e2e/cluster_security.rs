//! The pool's trust boundary end to end (S7, S8 of docs/RELIABILITY.md): a member that holds the
//! secret gets chunks of object-store objects and nothing else, and an attacker on the path between
//! two nodes can neither read the data nor change, replay, reorder or inject a frame unnoticed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use memarts_protocol::peer::{PeerRequest, PeerResponse};
use memarts_protocol::{ChunkRequest, ErrorCode, FirstRequest, Limits};
use memarts_proxy::cluster::auth::Secret;
use memarts_proxy::cluster::peer_client::{PeerClient, PeerError};
use memarts_proxy::cluster::Member;

use crate::common::cluster::{free_ports, Cluster};
use crate::common::peer_relay::{holds_plaintext, PeerRelay, ATTACKS};
use crate::common::{moto, pattern};

const CS: u64 = 256 << 10;

/// A client of the peer port that holds the cluster secret and calls itself node-a: a member.
fn member_client(cluster: &Cluster) -> PeerClient {
    let secret = std::fs::read(cluster.dir.path().join("cluster.secret")).unwrap();
    PeerClient::new(
        &cluster.ids[0],
        Secret::new(&secret).unwrap(),
        Duration::from_secs(2),
        Duration::from_secs(5),
    )
}

fn member(cluster: &Cluster, i: usize) -> Member {
    Member { id: cluster.ids[i].clone(), address: cluster.addresses[i].clone(), weight: 1.0 }
}

#[test]
fn a_member_holding_the_secret_gets_chunks_of_object_store_urls_and_nothing_else() {
    let bucket = moto().bucket("pool-member");
    let data = pattern(71, 3 * CS as usize + 100);
    moto().put(&bucket, "ok/object", &data);
    let cluster = Cluster::start(2, 1, "", &[]);
    let credentials = cluster.dir.path().join("credentials");
    std::fs::write(&credentials, "[default]\naws_secret_access_key = do-not-serve-me\n").unwrap();
    let secret_file = cluster.dir.path().join("cluster.secret");
    let hostile = member_client(&cluster);
    let b = member(&cluster, 1);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();

    let dir = cluster.dir.path().display().to_string();
    let local = [
        "/etc/passwd".to_string(),
        "file:///etc/passwd".to_string(),
        credentials.display().to_string(),
        format!("file://{}", secret_file.display()),
        format!("{dir}/../{}/cluster.secret", cluster.dir.path().file_name().unwrap().to_string_lossy()),
        "/tmp/../etc/passwd".to_string(),
        "file:///proc/self/environ".to_string(),
    ];
    for url in &local {
        let first = FirstRequest { url: url.clone(), chunk_size: CS, refresh: false };
        match rt.block_on(hostile.read_first(&b, &first)) {
            Err(PeerError::Answer(e)) => assert_eq!(e.code, ErrorCode::PermissionDenied, "{url}: {e:?}"),
            Err(e) => panic!("{url}: not a typed refusal: {e}"),
            Ok(f) => panic!("{url} was served to a member: {} bytes", f.chunk.map_or(0, |c| c.data.len())),
        }
        let chunk = ChunkRequest {
            url: url.clone(),
            etag: "\"any\"".into(),
            object_size: 4096,
            chunk_size: CS,
            index: 0,
            recheck: false,
        };
        match rt.block_on(hostile.read_chunk(&b, &chunk)) {
            Err(PeerError::Answer(e)) => assert_eq!(e.code, ErrorCode::PermissionDenied, "{url}: {e:?}"),
            other => panic!("{url}: chunk read not refused: {:?}", other.map(|f| f.data.len())),
        }
    }
    // `..` in an object key is refused as a bad key (it never names a local file).
    let dots =
        FirstRequest { url: format!("s3://{bucket}/../../etc/passwd"), chunk_size: CS, refresh: false };
    match rt.block_on(hostile.read_first(&b, &dots)) {
        Err(PeerError::Unreachable { why, .. }) => assert!(why.contains("BadRequest"), "{why}"),
        other => panic!("s3 key with ..: {:?}", other.map(|f| f.meta)),
    }
    // The bucket it may read is served, byte for byte.
    let url = format!("s3://{bucket}/ok/object");
    let first = rt
        .block_on(hostile.read_first(&b, &FirstRequest { url: url.clone(), chunk_size: CS, refresh: false }));
    let first = first.unwrap_or_else(|e| panic!("a member's read of {url}: {e}"));
    assert_eq!(first.meta.size, data.len() as u64);
    assert_eq!(first.chunk.unwrap().data, &data[..CS as usize]);
    let refused = cluster.counter(1, 1, "refused_requests");
    assert_eq!(refused, 2 * local.len() as u64, "refused requests not counted");
    let logged = cluster.log_lines("refused a member's read");
    assert!(!logged.is_empty() && logged.len() <= 2, "refusals not logged, or not rate-limited: {logged:#?}");

    // `recheck` from a member makes the node drop and refetch nothing.
    let gets = moto().gets_settled(&bucket);
    let etag = first.meta.etag.clone().unwrap();
    let recheck = ChunkRequest {
        url: url.clone(),
        etag,
        object_size: data.len() as u64,
        chunk_size: CS,
        index: 0,
        recheck: true,
    };
    let answer = rt.block_on(async {
        let mut sealed = hostile.connect(&b, 0).await.unwrap();
        sealed.send(&PeerRequest::ReadChunk(recheck), &[]).await.unwrap();
        sealed.recv::<PeerResponse>(Limits::RESPONSE).await.unwrap()
    });
    assert!(matches!(answer.0, PeerResponse::Chunk(_)), "{:?}", answer.0);
    assert_eq!(answer.1, &data[..CS as usize]);
    assert_eq!(moto().gets_settled(&bucket), gets, "a member's recheck refetched a cached chunk");
    assert_eq!(cluster.nodes[1].total("corrupt_chunks"), 0, "a member's recheck dropped a chunk");
}

/// Node b's peer ports behind a relay; a's reads of what b owns go through it.
fn pool_behind_relay(attacking: bool) -> (Cluster, PeerRelay) {
    let mut cluster =
        Cluster::new(2, 2, "peer_timeout_secs = 2\nconnect_timeout_secs = 1\nsuspect_secs = 1\n", &[]);
    let hidden = format!("127.0.0.9:{}", free_ports(&["127.0.0.9".to_string()], cluster.slots));
    cluster.nodes[1].extra_env.push(("MEMARTS_PEER_LISTEN".into(), hidden.clone()));
    let relay = PeerRelay::start(&cluster.addresses[1], &hidden, cluster.slots, attacking);
    cluster.start_node(0);
    cluster.start_node(1);
    (cluster, relay)
}

/// `n` objects under `prefix` of 1 to 4 chunks and a bit (a chunk is 4 full records and a short one).
fn dataset(bucket: &str, prefix: &str, n: usize) -> Arc<Vec<(String, Vec<u8>)>> {
    Arc::new(
        (0..n)
            .map(|i| {
                let data =
                    pattern(900 + i as u64 + prefix.len() as u64, (1 + i % 4) * CS as usize + 1000 + i);
                moto().put(bucket, &format!("{prefix}/{i:03}"), &data);
                (format!("s3://{bucket}/{prefix}/{i:03}"), data)
            })
            .collect(),
    )
}

/// Node a's `threads` readers read the whole dataset once, each verifying every byte.
fn read_all(cluster: &Cluster, data: &Arc<Vec<(String, Vec<u8>)>>, threads: usize) {
    let client = Arc::new(cluster.client(0, CS));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (client, data) = (client.clone(), data.clone());
            std::thread::spawn(move || {
                for k in 0..data.len() {
                    let (url, want) = &data[(k + t) % data.len()];
                    let got = client.read(url).unwrap_or_else(|e| panic!("{url}: {e}"));
                    assert!(got == *want, "{url}: wrong bytes");
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("a reader failed");
    }
}

/// A counter of node `i`'s slots (`memarts status`: asks no other node, so opens no connection
/// through the relay).
fn local_counter(cluster: &Cluster, i: usize, name: &str) -> u64 {
    let status = cluster.nodes[i].status();
    status["slots"].as_array().unwrap().iter().filter_map(|s| s["cluster"][name].as_u64()).sum()
}

fn counter_sum(cluster: &Cluster, name: &str) -> u64 {
    (0..2).map(|i| local_counter(cluster, i, name)).sum()
}

#[test]
fn an_on_path_attacker_changes_replays_reorders_and_injects_nothing_unnoticed_and_reads_no_data() {
    let bucket = moto().bucket("pool-onpath");
    let (cluster, relay) = pool_behind_relay(true);
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut read = Vec::new();
    // Epochs of new objects (what node a read from the origin while b was routed around, it keeps)
    // until every attack has fired: each connection through the relay meets one.
    for epoch in 0.. {
        if ATTACKS.iter().all(|a| relay.fired(*a) > 0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not every attack fired in 90 s: {:?} over {} connections",
            ATTACKS.iter().map(|a| (a, relay.fired(*a))).collect::<Vec<_>>(),
            relay.connections()
        );
        let data = dataset(&bucket, &format!("e{epoch}"), 12);
        read_all(&cluster, &data, 4);
        read.push(data);
        // Past the back-off: the probe and the pools open fresh connections, which meet the next attacks.
        std::thread::sleep(Duration::from_millis(1200));
    }
    // The relay goes on attacking the connections the members keep (probes, pools) while this
    // counts: the counts are taken again until the relay's and the members' agree, or for 10 s.
    let counts = || {
        let requests: u64 = ATTACKS.iter().filter(|a| a.on_requests()).map(|a| relay.fired(*a)).sum();
        let replies = relay.total_fired() - requests;
        let at = |node| local_counter(&cluster, node, "forged_frames");
        (requests, replies, at(0), at(1))
    };
    let settle_by = Instant::now() + Duration::from_secs(10);
    let (requests, replies, at_a, at_b) = loop {
        let (requests, replies, at_a, at_b) = counts();
        if (at_b, at_a) == (requests, replies) || Instant::now() > settle_by {
            break (requests, replies, at_a, at_b);
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(
        (at_b, at_a),
        (requests, replies),
        "forged records detected by b (requests) and a (replies) against the attacks fired ({:?} over {} connections)",
        ATTACKS.iter().map(|a| (a, relay.fired(*a))).collect::<Vec<_>>(),
        relay.connections()
    );
    assert_eq!(local_counter(&cluster, 1, "refused_requests"), 0, "an injected request was parsed");
    assert!(local_counter(&cluster, 0, "fallbacks") > 0, "no read was routed around");
    let served = local_counter(&cluster, 1, "served_bytes");
    let capture = relay.capture();
    assert!(served > 0 && capture.len() as u64 > served / 2, "served {served}, captured {}", capture.len());
    let plain: Vec<&[u8]> = read.iter().flat_map(|d| d.iter().map(|(_, d)| &d[..])).collect();
    assert!(!holds_plaintext(&capture, &plain), "the data crossed the relay in clear");
    // The check can fail: the data itself holds its plaintext.
    assert!(holds_plaintext(&read[0][3].1, &plain));
    relay.stop();
}

#[test]
fn a_capture_of_a_clean_link_holds_no_plaintext_of_the_data_read_through_it() {
    let bucket = moto().bucket("pool-capture");
    let data = dataset(&bucket, "ds", 16);
    let (cluster, relay) = pool_behind_relay(false);
    read_all(&cluster, &data, 2);
    let served = local_counter(&cluster, 1, "served_bytes");
    assert!(served > (data.iter().map(|(_, d)| d.len() as u64).sum::<u64>() / 4), "b served {served} bytes");
    assert_eq!(counter_sum(&cluster, "forged_frames"), 0, "a clean link had forged records");
    let capture = relay.capture();
    assert!(capture.len() as u64 > served, "served {served}, captured {}", capture.len());
    let plain: Vec<&[u8]> = data.iter().map(|(_, d)| &d[..]).collect();
    assert!(!holds_plaintext(&capture, &plain), "the data crossed the link in clear");
    relay.stop();
}

/// A peer's metadata is trusted for what is left of its TTL since the origin confirmed it on that
/// node, not for a whole TTL from when it arrived: objects replaced at the origin are read new by
/// every node once the first confirmation is a TTL old.
#[test]
fn metadata_from_a_peer_is_trusted_only_for_what_is_left_of_its_ttl() {
    const TTL: f64 = 3.0;
    let bucket = moto().bucket("pool-ttl");
    let config = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(config.path(), format!("meta_ttl_secs = {TTL}\n")).unwrap();
    let cluster = Cluster::start(2, 1, "", &[("MEMARTS_CONFIG", config.path().to_str().unwrap())]);
    let (a, b) = (cluster.client(0, 64 << 10), cluster.client(1, 64 << 10));
    let old: Vec<Vec<u8>> = (0..10).map(|i| pattern(300 + i, 100_000)).collect();
    for (i, data) in old.iter().enumerate() {
        moto().put(&bucket, &format!("o/{i}"), data);
    }
    let url = |i: usize| format!("s3://{bucket}/o/{i}");
    let t0 = Instant::now();
    for (i, data) in old.iter().enumerate() {
        assert_eq!(b.read(&url(i)).unwrap(), *data, "node b, first read");
    }
    // Node a's first reads go to the owners of chunk 0: half of them node b, whose metadata is 2 s old.
    std::thread::sleep(Duration::from_secs_f64(TTL * 2.0 / 3.0).saturating_sub(t0.elapsed()));
    for (i, data) in old.iter().enumerate() {
        assert_eq!(a.read(&url(i)).unwrap(), *data, "node a, first read");
    }
    let from_b = local_counter(&cluster, 0, "peer_reads");
    assert!(from_b > 0, "no first read of node a went to node b");
    std::thread::sleep(Duration::from_millis(300));
    let new: Vec<Vec<u8>> = (0..10).map(|i| pattern(400 + i, 100_000)).collect();
    for (i, data) in new.iter().enumerate() {
        moto().put(&bucket, &format!("o/{i}"), data);
    }
    // A TTL after node b's confirmation (had node a trusted its copy a whole TTL from its arrival,
    // it would still read the old version for two more seconds).
    std::thread::sleep(Duration::from_secs_f64(TTL + 0.6).saturating_sub(t0.elapsed()));
    for (i, data) in new.iter().enumerate() {
        assert!(a.read(&url(i)).unwrap() == *data, "node a read an old version of {} past its TTL", url(i));
    }
    assert!(t0.elapsed() < Duration::from_secs_f64(TTL * 5.0 / 3.0), "too slow to tell: {:?}", t0.elapsed());
}
