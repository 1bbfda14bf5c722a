use std::time::{SystemTime, UNIX_EPOCH};

use memarts_disk::layout::{fleet_file, meta_table_path};
use memarts_disk::meta_table::{url_key, Published, TableFile};

use super::LocalReads;
use crate::conn::Dialer;

fn published(size: u64) -> Published {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
    Published { size, etag: format!("\"e{size}\""), last_modified_ms: 0, verified_ms: now }
}

/// A slot's table that grew (a new file renamed over the old one, which it marks superseded): a
/// reader that mapped the old one reads the new one's entries at once, not a second later.
#[test]
fn a_table_that_grew_is_read_at_once_by_a_reader_of_the_old_one() {
    let run = tempfile::tempdir().unwrap();
    let facts = serde_json::json!({"slots": 1, "cache_dir": run.path().join("cache"), "meta_ttl_secs": 60.0});
    std::fs::write(fleet_file(run.path()), facts.to_string()).unwrap();
    let path = meta_table_path(run.path(), 0);
    let old = TableFile::create(&path, 16, 60_000).unwrap();
    old.table().publish(url_key("s3://b/first"), &published(1));
    let uid = nix::unistd::geteuid().as_raw();
    let dial = std::sync::Arc::new(Dialer::new(run.path().to_path_buf(), uid, std::time::Duration::ZERO, 1));
    let direct = LocalReads::new(&dial).expect("local reads");
    assert_eq!(direct.meta("s3://b/first", 0).map(|m| m.size), Some(1), "mapped and read");

    let new = TableFile::create(&path, 32, 60_000).unwrap();
    new.table().publish(url_key("s3://b/first"), &published(1));
    new.table().publish(url_key("s3://b/second"), &published(2));
    old.table().mark_superseded();
    assert_eq!(direct.meta("s3://b/second", 0).map(|m| m.size), Some(2), "the new table, at once");
    assert_eq!(direct.meta("s3://b/first", 0).map(|m| m.size), Some(1));
}
