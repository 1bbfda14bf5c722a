//! Expired metadata revalidated by listing the objects' directories (issue 29): a warm epoch that
//! starts after the metadata TTL asks the origin once per directory page, not once per object; an
//! object replaced at the origin is read new, never mixed; a listing that fails falls back to
//! HEADs with no failed read.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::fault_relay::{Fault, FaultRelay, Match};
use crate::common::{moto, pattern, Fleet};

const TTL: f64 = 3.0;
/// The TTL of the pool's test.
const POOL_TTL: f64 = 6.0;

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

/// A fleet of `n` slots with the tests' metadata TTL, its index rebuilt (and its config file,
/// to keep while it runs).
fn fleet_with_ttl(n: u32) -> (tempfile::NamedTempFile, Fleet) {
    let config = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(config.path(), format!("meta_ttl_secs = {TTL}\n")).unwrap();
    let fleet = Fleet::start(n, &[("MEMARTS_CONFIG", config.path().to_str().unwrap())]);
    fleet.wait_index_ready();
    (config, fleet)
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
    let (_config, fleet) = fleet_with_ttl(4);
    let started = Instant::now();
    epoch(&fleet, &data, 8);
    eprintln!("epoch 1: {:?}", started.elapsed());
    // Two objects of each directory change; then a TTL passes, after which every version known
    // before the change has expired (a directory listed ahead of the TTL, `refresh.rs`, may have
    // been listed just before it).
    let replaced: Vec<usize> = vec![5, 1400, 2999, 7, 1501, 2];
    let mut now = (*data).clone();
    for &i in &replaced {
        now[i].1 = pattern(99_000 + i as u64, 333);
        moto().put(&bucket, now[i].0.trim_start_matches(&format!("s3://{bucket}/")), &now[i].1);
    }
    data = Arc::new(now);
    std::thread::sleep(Duration::from_secs_f64(TTL + 0.5));
    let (heads, lists) = heads_and_lists(&bucket);
    // Counted after the origin's count: a listing made ahead between the two would be in both.
    let ahead_before = fleet.metric_total("refreshed_listings") as usize;
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
    // Listings made ahead of the TTL for the next epoch (`refresh.rs`) are not this epoch's (each
    // counted by the fleet before the origin's count is read again, so within `lists2 - lists`).
    let ahead = fleet.metric_total("refreshed_listings") as usize - ahead_before;
    let (heads2, lists2) = if ahead > 0 { heads_and_lists(&bucket) } else { (heads2, lists2) };
    let (new_heads, new_lists) = (heads2 - heads, lists2 - lists - ahead);
    assert!(
        new_heads + new_lists <= 3,
        "3,000 objects in 3 directories revalidated with {new_heads} HEADs and {new_lists} LISTs"
    );
    // The replaced objects were fetched again (one GET each: their new chunk 0), nothing else.
    assert_eq!(moto().gets_settled(&bucket) - gets, replaced.len(), "GETs of epoch 2");
}

/// A client's listing (a dataset built `from_prefix`, `ls`, `warmup`) tells every slot the versions
/// it shows: the epoch after it asks the origin nothing more, though every object's metadata had
/// expired.
#[test]
fn after_a_client_lists_the_dataset_its_expired_objects_are_read_with_no_origin_request() {
    let bucket = moto().bucket("listed");
    let data = dataset(&bucket, 2, 700);
    let (_config, fleet) = fleet_with_ttl(4);
    epoch(&fleet, &data, 8);
    std::thread::sleep(Duration::from_secs_f64(TTL + 0.5));
    let (heads, lists) = heads_and_lists(&bucket);
    let ahead_before = fleet.metric_total("refreshed_listings") as usize;
    let gets = moto().gets_settled(&bucket);
    let started = Instant::now();
    let listed = fleet.client(1 << 20).list(&format!("s3://{bucket}/ds/"), true).unwrap();
    assert_eq!(listed.len(), data.len());
    let (_, after_listing) = heads_and_lists(&bucket);
    epoch(&fleet, &data, 8);
    assert!(started.elapsed() < Duration::from_secs_f64(TTL), "the epoch outlived the TTL");
    let (heads2, lists2) = heads_and_lists(&bucket);
    assert!(after_listing > lists, "the client's listing was not made");
    assert_eq!(heads2 - heads, 0, "HEADs after the client's listing");
    // Every LIST after the client's was made ahead of the TTL. (One made ahead may also have
    // listed while the client's listing ran, or be counted by its slot a moment after its LIST.)
    std::thread::sleep(Duration::from_millis(300));
    let ahead = fleet.metric_total("refreshed_listings") as usize - ahead_before;
    assert!(
        lists2 - after_listing <= ahead,
        "LISTs besides the client's: {} after it, {ahead} made ahead of the TTL",
        lists2 - after_listing
    );
    assert_eq!(moto().gets_settled(&bucket) - gets, 0, "GETs of a warm epoch");
}

/// Listings kept fresh ahead of the TTL (`refresh.rs`): once the slots asked for versions of the
/// dataset's directories, an epoch that starts two TTLs after the last finds every version still
/// fresh (no read waits for a listing, none asks with a HEAD), and an object replaced meanwhile is
/// read new.
#[test]
fn directories_being_read_are_listed_ahead_so_a_later_epoch_waits_for_no_listing() {
    let bucket = moto().bucket("ahead");
    let mut data = dataset(&bucket, 3, 300);
    let (_config, fleet) = fleet_with_ttl(4);
    epoch(&fleet, &data, 8);
    // Past the TTL: this epoch revalidates by listing, which tells each directory's owner who reads it.
    std::thread::sleep(Duration::from_secs_f64(TTL + 0.5));
    epoch(&fleet, &data, 8);
    let revalidated = fleet.metric_total("listed_revalidations");
    assert!(revalidated > 0.0, "the second epoch did not revalidate");
    std::thread::sleep(Duration::from_secs_f64(2.0 * TTL));
    let mut now = (*data).clone();
    for i in [4, 450] {
        now[i].1 = pattern(55_000 + i as u64, 321);
        moto().put(&bucket, now[i].0.trim_start_matches(&format!("s3://{bucket}/")), &now[i].1);
    }
    data = Arc::new(now);
    // Listed again at least once more since (a listing that started before the replacement may
    // show the old versions, for what is left of their TTL).
    std::thread::sleep(Duration::from_secs_f64(TTL));
    let (heads, _) = heads_and_lists(&bucket);
    let refreshed = fleet.metric_total("refreshed_listings");
    assert!(refreshed >= 3.0, "{refreshed} listings refreshed in three TTLs");
    epoch(&fleet, &data, 8);
    let (heads2, _) = heads_and_lists(&bucket);
    assert_eq!(
        fleet.metric_total("listed_revalidations"),
        revalidated,
        "a read of the third epoch waited for a listing"
    );
    assert_eq!(heads2 - heads, 0, "HEADs in the third epoch");
}

/// After a clean restart, each slot asks once per directory of the metadata it saved: the first
/// epoch past the TTL waits for no listing (reads with the default chunk size, 1 MiB).
#[test]
fn after_a_clean_restart_the_first_epoch_past_the_ttl_waits_for_no_listing() {
    first_epoch_after_a_restart_waits_for_no_listing("restarted", Duration::ZERO);
}

/// The same when the fleet stopped after its metadata had expired (a job that ran its last epoch
/// well before the restart): the snapshot keeps expired versions too, and the restarted slots ask
/// about their directories, so the first epoch waits for no listing and makes no HEAD either.
#[test]
fn after_a_restart_of_a_fleet_whose_metadata_had_expired_the_first_epoch_waits_for_no_listing() {
    // Past the TTL: nothing asked for these directories' versions since the reads, so no slot kept
    // them fresh, and every entry is expired when the fleet stops.
    first_epoch_after_a_restart_waits_for_no_listing("restarted-expired", Duration::from_secs_f64(1.5 * TTL));
}

/// A dataset read by a fleet, which stops `idle` later and starts again: the first epoch past the
/// TTL after that waits for no listing and makes no HEAD.
fn first_epoch_after_a_restart_waits_for_no_listing(bucket: &str, idle: Duration) {
    let bucket = moto().bucket(bucket);
    let data = dataset(&bucket, 3, 200);
    let (_config, fleet) = fleet_with_ttl(4);
    epoch(&fleet, &data, 8);
    std::thread::sleep(idle);
    assert!(fleet.stop_proxy().status.success());
    fleet.start_proxy(4);
    fleet.wait_index_ready();
    std::thread::sleep(Duration::from_secs_f64(2.0 * TTL));
    let (heads, _) = heads_and_lists(&bucket);
    epoch(&fleet, &data, 8);
    let (heads2, _) = heads_and_lists(&bucket);
    assert_eq!(fleet.metric_total("listed_revalidations"), 0.0, "a read waited for a listing");
    assert_eq!(heads2 - heads, 0, "HEADs of the first epoch after the restart");
}

/// A bucket holding one directory of 60 objects, and a fleet of 2 slots with the tests' TTL that
/// reaches it through a fault relay.
struct Relayed {
    relay: FaultRelay,
    bucket: String,
    data: Arc<Vec<(String, Vec<u8>)>>,
    fleet: Fleet,
    /// The fleet's config dir, kept while it runs.
    _cfg: tempfile::TempDir,
}

fn one_directory_through_a_relay(name: &str) -> Relayed {
    let relay = FaultRelay::start(&moto().endpoint);
    let bucket = moto().bucket(name);
    let data = dataset(&bucket, 1, 60);
    let (_cfg, fleet) = relay.fleet(2, &format!("meta_ttl_secs = {TTL}"), &[]);
    fleet.wait_index_ready();
    Relayed { relay, bucket, data, fleet, _cfg }
}

/// The relay's match for LIST requests (ListObjectsV2).
fn listings() -> Match {
    Match { method: Some("GET"), ranged: false, path_contains: Some("list-type".into()) }
}

#[test]
fn a_listing_that_fails_falls_back_to_heads_with_no_failed_read() {
    let Relayed { relay, bucket, data, fleet, _cfg } = one_directory_through_a_relay("relist-503");
    epoch(&fleet, &data, 4);
    // Every attempt of the next listing is refused (6 attempts, the origin's retries included):
    // a revalidation's, or one made ahead of the TTL (`refresh.rs`), after which the directory's
    // versions expire all the same.
    let list = listings();
    let injected = relay.injected();
    relay.inject(list, Fault::Status(503), 6);
    std::thread::sleep(Duration::from_secs_f64(TTL + 0.5));
    let (heads, _) = heads_and_lists(&bucket);
    epoch(&fleet, &data, 4);
    assert_eq!(relay.injected() - injected, 6, "the listing was not asked for");
    let (heads2, _) = heads_and_lists(&bucket);
    assert!(heads2 > heads, "no object was revalidated with a HEAD after the listing failed");
}

/// An origin whose listings name no versions (no `<ETag>`s, as some S3-compatible servers list):
/// the listing tells nothing of a version, so the objects are revalidated with HEADs and read
/// whole, and the bucket is not listed again for the TTL.
#[test]
fn listings_without_etags_fall_back_to_heads_with_no_failed_read() {
    let Relayed { relay, bucket, data, fleet, _cfg } = one_directory_through_a_relay("relist-noetag");
    let list = listings();
    relay.inject(list, Fault::NoETags, 1000);
    epoch(&fleet, &data, 4);
    std::thread::sleep(Duration::from_secs_f64(TTL + 0.5));
    let (heads, _) = heads_and_lists(&bucket);
    let injected = relay.injected();
    epoch(&fleet, &data, 4);
    let (heads2, _) = heads_and_lists(&bucket);
    assert!(heads2 > heads, "no object was revalidated with a HEAD");
    assert!(
        relay.injected() - injected <= 2,
        "listed {} times: the bucket's listings name no versions",
        relay.injected() - injected
    );
}

/// The same in a pool of 3 nodes: each directory is listed once for the pool (by the node that owns
/// it), not once per node. Its own, longer TTL: 3 nodes' epochs of 900 reads each must fit in one
/// (on 2 cores, in a debug build, beside the rest of the suite, 3 s was once not enough).
#[test]
fn in_a_pool_each_directory_is_listed_once_not_once_per_node() {
    let bucket = moto().bucket("relist-pool");
    let data = dataset(&bucket, 3, 300);
    let config = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(config.path(), format!("meta_ttl_secs = {POOL_TTL}\n")).unwrap();
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
    std::thread::sleep(Duration::from_secs_f64(POOL_TTL + 0.5));
    let refreshed = |c: &crate::common::cluster::Cluster| -> usize {
        c.nodes.iter().map(|n| n.metric_total("refreshed_listings") as usize).sum()
    };
    let ahead_before = refreshed(&cluster);
    let (heads, lists) = heads_and_lists(&bucket);
    let started = Instant::now();
    read_everywhere(&data);
    assert!(
        started.elapsed() < Duration::from_secs_f64(POOL_TTL),
        "epoch 2 outlived the TTL: {:?}",
        started.elapsed()
    );
    let (heads2, lists2) = heads_and_lists(&bucket);
    let ahead = refreshed(&cluster) - ahead_before;
    let (new_heads, new_lists) = (heads2 - heads, lists2 - lists - ahead);
    assert!(
        new_heads + new_lists <= 3,
        "3 nodes revalidated 900 objects in 3 directories with {new_heads} HEADs and {new_lists} LISTs"
    );
}

/// Slots tell one another versions (`Listed`, `Revalidate`, `Forget`): a client of another uid the
/// fleet lets in may not, and one of the fleet's uid is held to the directory and range it names.
#[test]
fn only_the_fleets_own_slots_tell_versions_and_within_what_they_listed() {
    use crate::common::raw::{self, OTHER_UID};
    use memarts_protocol::{frame, ErrorCode, ListedRange, ObjectMeta, Request, Response, RevalidateRequest};

    let bucket = moto().bucket("vouch");
    moto().put(&bucket, "d/o", b"the true bytes");
    let config = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(config.path(), format!("allowed_uids = [{OTHER_UID}]\n")).unwrap();
    let fleet = Fleet::start(1, &[("MEMARTS_CONFIG", config.path().to_str().unwrap())]);
    let forged = ObjectMeta { size: 3, etag: Some("\"forged\"".into()), version: None, last_modified_ms: 0 };
    let listed = |dir: &str, key: &str| {
        Request::Listed(vec![ListedRange {
            dir: dir.into(),
            after: None,
            last: None,
            more: false,
            listed_ms_ago: 0,
            entries: vec![(key.into(), forged.clone())],
        }])
    };
    let url = format!("s3://{bucket}/d/o");
    let requests = [
        listed(&format!("s3://{bucket}/d"), "d/o"),
        Request::Revalidate(RevalidateRequest { url: url.clone(), chunk_size: 0, slot: 0, slots: 1 }),
        Request::Forget { url: url.clone() },
        Request::Confirm(vec![(
            url.clone(),
            memarts_protocol::ConfirmedMeta { meta: forged.clone(), confirmed_ms_ago: 0 },
        )]),
    ];
    let mut bytes = raw::hello();
    for r in &requests {
        bytes.extend(frame::encode(r, 0).unwrap());
    }
    let got = raw::as_other_user(&raw::open_to_other_users(&fleet), &bytes).expect("uid 65534 is let in");
    let mut answers = std::io::Cursor::new(got);
    assert!(matches!(
        frame::read_sync::<Response, _>(&mut answers, memarts_protocol::Limits::RESPONSE),
        Ok((_, Response::Welcome(_)))
    ));
    for r in &requests {
        match frame::read_sync::<Response, _>(&mut answers, memarts_protocol::Limits::RESPONSE) {
            Ok((_, Response::Error(e))) if e.code == ErrorCode::PermissionDenied => {}
            other => panic!("{r:?} of uid {OTHER_UID}: {other:?}"),
        }
    }
    // The fleet's own uid: a key outside the directory, or a directory of a local path, is refused.
    let mut s = raw::welcomed(&fleet.run_dir.join("proxy-0.sock"));
    for bad in [
        listed(&format!("s3://{bucket}/d"), "e/o"),
        listed("/etc", "/etc/passwd"),
        listed(&format!("s3://{bucket}/d"), "d/sub/o"),
    ] {
        match raw::call(&mut s, &bad) {
            Some(Response::Error(e)) if e.code == ErrorCode::BadRequest => {}
            other => panic!("{bad:?}: {other:?}"),
        }
    }
    assert!(fleet.client(1 << 20).read(&url).unwrap() == b"the true bytes");
}
