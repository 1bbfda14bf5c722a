//! What pages of a listing tell of whole directories: never a version the origin did not have, never
//! an object absent that exists, and, once a listing went to its end, every object known.

use std::time::Duration;

use memarts_protocol::{ListEntry, ListPage, ObjectMeta, ObjectUrl};
use rand::{Rng, SeedableRng};

use super::super::dir_versions::{DirVersions, Seen};
use super::{batches, listed_ranges};

fn entry(key: &str, is_dir: bool) -> ListEntry {
    ListEntry {
        url: format!("s3://b/{key}"),
        is_dir,
        size: key.len() as u64,
        etag: (!is_dir).then(|| format!("\"{key}\"")),
        last_modified_ms: 7,
    }
}

/// A page of a listing of `prefix` (a path: `a` and `a/` both list what is below `a/`) over `keys`
/// (sorted), as `Origin::list` makes it: recursive, or one level with common prefixes as
/// directories (named without a trailing `/`), in key order; `n` entries from after `after`.
fn page(keys: &[String], prefix: &str, recursive: bool, after: Option<&str>, n: usize) -> ListPage {
    let path = prefix.trim_end_matches('/');
    let below = |k: &str| {
        if path.is_empty() {
            Some(k.to_string())
        } else {
            k.strip_prefix(&format!("{path}/")).map(str::to_string)
        }
    };
    let mut all: Vec<ListEntry> = Vec::new();
    for key in keys {
        let Some(rest) = below(key) else { continue };
        let e = match rest.find('/') {
            Some(i) if !recursive => entry(&key[..key.len() - rest.len() + i], true),
            _ => entry(key, false),
        };
        if !all.iter().any(|x| x.url == e.url) {
            all.push(e);
        }
    }
    all.sort_by(|a, b| a.url.cmp(&b.url));
    all.retain(|e| after.is_none_or(|a| e.url.as_str() > format!("s3://b/{a}").as_str()));
    if all.len() > n {
        all.truncate(n);
        let next = all.last().map(|l| l.url.clone());
        return ListPage { entries: all, next };
    }
    ListPage { entries: all, next: None }
}

fn dir_of(key: &str) -> &str {
    key.rsplit_once('/').map_or("", |(d, _)| d)
}

fn dir_url(dir: &str) -> String {
    if dir.is_empty() {
        "s3://b".to_string()
    } else {
        format!("s3://b/{dir}")
    }
}

#[test]
fn pages_of_random_listings_never_tell_a_wrong_version_and_a_whole_listing_tells_all() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(29);
    for round in 0..200 {
        let names = ["a", "b", "a-", "a0", "c", "ab", "é"];
        let mut keys: Vec<String> = (0..rng.random_range(1..120))
            .map(|_| {
                let depth = rng.random_range(0..4);
                let mut parts: Vec<String> =
                    (0..depth).map(|_| names[rng.random_range(0..names.len())].into()).collect();
                parts.push(format!("{}{}", names[rng.random_range(0..names.len())], rng.random_range(0..30)));
                parts.join("/")
            })
            .collect();
        keys.sort();
        keys.dedup();
        // A key cannot also be a directory's name for S3's sake here: drop those that are.
        let dirs: std::collections::BTreeSet<String> = keys.iter().map(|k| dir_of(k).to_string()).collect();
        keys.retain(|k| !dirs.contains(k));
        let prefixes = ["", "a/", "a", "a/b/", "é/", "c"];
        let prefix = prefixes[round % prefixes.len()];
        let recursive = round % 3 != 0;
        let n = rng.random_range(1..40);
        let versions = DirVersions::new(Duration::from_secs(60));
        let url = ObjectUrl::parse(&format!("s3://b/{prefix}"))
            .unwrap_or_else(|_| ObjectUrl::parse("s3://b").unwrap());
        let mut after: Option<String> = None;
        loop {
            let p = page(&keys, prefix, recursive, after.as_deref(), n);
            for r in listed_ranges(&url, after.clone(), &p, Duration::ZERO) {
                versions.record(&r.dir, r.after, r.last, r.more, std::time::Instant::now(), r.entries);
            }
            after = p.next.map(|u| u.trim_start_matches("s3://b/").to_string());
            if after.is_none() {
                break;
            }
            // Nothing told so far is wrong.
            check(&versions, &keys, prefix, recursive, false);
        }
        check(&versions, &keys, prefix, recursive, true);
    }
}

/// Every lookup agrees with `keys`; `whole`: the listing ended, so every object of a directory
/// it held whole (and, one level only, of the prefix's own directory) is known.
fn check(versions: &DirVersions, keys: &[String], prefix: &str, recursive: bool, whole: bool) {
    let path = prefix.trim_end_matches('/');
    let held =
        |dir: &str| dir == path || (recursive && (path.is_empty() || dir.starts_with(&format!("{path}/"))));
    for key in keys {
        let dir = dir_of(key);
        match versions.lookup(&dir_url(dir), key) {
            Seen::Listed(meta, _) => {
                assert_eq!(meta.etag, Some(format!("\"{key}\"")), "{key}");
                assert_eq!(meta.size, key.len() as u64);
            }
            Seen::Absent | Seen::Unversioned => {
                panic!("{key} exists with an ETag and was told absent or unversioned (prefix {prefix:?})")
            }
            Seen::Unknown => {
                assert!(!(whole && held(dir)), "{key}: not known after the whole listing of {prefix:?}")
            }
        }
        // A key of the same directory that does not exist is never told to be there.
        let missing = format!("{key}~");
        if !keys.contains(&missing) {
            assert!(!matches!(versions.lookup(&dir_url(dir), &missing), Seen::Listed(..)), "{missing}");
        }
    }
}

#[test]
fn a_directory_the_prefix_cuts_into_is_not_kept_and_big_pages_go_in_pieces() {
    let keys: Vec<String> = (0..3000).map(|i| format!("train/a{i:05}")).collect();
    let url = ObjectUrl::parse("s3://b/train/a0").unwrap();
    let p = ListPage { entries: keys[..10].iter().map(|k| entry(k, false)).collect(), next: None };
    assert!(listed_ranges(&url, None, &p, Duration::ZERO).is_empty(), "train/ is not listed whole");
    let url = ObjectUrl::parse("s3://b/train/").unwrap();
    let p = page(&keys, "train/", true, None, 1000);
    let ranges = listed_ranges(&url, None, &p, Duration::from_millis(5));
    assert!(ranges.len() > 1, "1,000 entries are more than one piece");
    assert_eq!(ranges.iter().map(|r| r.entries.len()).sum::<usize>(), 1000);
    assert!(ranges.iter().all(|r| r.more && r.listed_ms_ago == 5 && r.dir == "s3://b/train"));
    for pair in ranges.windows(2) {
        assert_eq!(pair[0].last, pair[1].after, "pieces follow one another");
    }
    for batch in batches(ranges) {
        let bytes: usize = batch
            .iter()
            .flat_map(|r| &r.entries)
            .map(|(k, m)| k.len() + m.etag.as_ref().unwrap().len())
            .sum();
        assert!(bytes < 40 << 10, "a batch of {bytes} bytes");
        let encoded = postcard::to_allocvec(&memarts_protocol::Request::Listed(batch)).unwrap();
        assert!(encoded.len() < 60 << 10, "a Listed of {} bytes", encoded.len());
    }
}

#[test]
fn an_object_meta_from_a_listing_is_the_entry_s() {
    let keys = vec!["d/x".to_string()];
    let url = ObjectUrl::parse("s3://b/d/").unwrap();
    let r = &listed_ranges(&url, None, &page(&keys, "d/", false, None, 10), Duration::ZERO)[0];
    let want = ObjectMeta { size: 3, etag: Some("\"d/x\"".into()), version: None, last_modified_ms: 7 };
    assert_eq!((r.dir.as_str(), r.after.clone(), r.last.clone(), r.more), ("s3://b/d", None, None, false));
    assert_eq!(r.entries, vec![("d/x".to_string(), want)]);
}
