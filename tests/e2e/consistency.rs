//! Integrity: a new object version is served after the metadata TTL, one read never mixes versions,
//! and damaged chunk files are detected, counted and re-fetched.

use std::time::Duration;

use crate::common::{moto, pattern, Fleet};

const CS: u64 = 64 << 10;

#[test]
fn an_overwritten_object_is_served_new_after_the_ttl_and_never_mixed() {
    let bucket = moto().bucket("overwrite");
    let v1 = pattern(50, 6 * CS as usize);
    let v2 = pattern(51, 6 * CS as usize + 99);
    moto().put(&bucket, "o", &v1);
    let fleet = Fleet::start(2, &[]);
    std::fs::write(fleet.dir.path().join("ttl.toml"), "meta_ttl_secs = 1.0\n").unwrap();
    fleet.stop_proxy();
    let cfg = fleet.dir.path().join("ttl.toml").display().to_string();
    let out = fleet.memarts(&["--config", &cfg, "start_proxy", "2"]);
    assert!(out.status.success(), "{}", crate::common::text(&out.stderr));
    let client = fleet.client(CS);
    let url = format!("s3://{bucket}/o");
    assert_eq!(client.read(&url).unwrap(), v1);
    let old_meta = client.stat(&url).unwrap();
    moto().put(&bucket, "o", &v2);
    // Within the TTL the cached version may still be served, but whole.
    let within = client.read(&url).unwrap();
    assert!(within == v1 || within == v2, "a read mixed versions");
    std::thread::sleep(Duration::from_millis(1200));
    assert_eq!(client.read(&url).unwrap(), v2, "the new version after the TTL");
    // A read pinned to the old ETag must fail typed for chunks it has not cached, never mix.
    let mut buf = vec![0u8; v1.len()];
    let uncached =
        memarts_shim::Client::new(memarts_shim::ShimConfig { chunk_size: 2 * CS, ..client.config().clone() })
            .unwrap();
    let err = uncached.read_at(&url, &old_meta, 0, &mut buf[..]).unwrap_err();
    assert!(matches!(err, memarts_shim::Error::Stale(_)), "{err}");
    // A whole-object read starts over from fresh metadata instead of failing.
    moto().put(&bucket, "o", &v1);
    assert_eq!(uncached.read(&url).unwrap(), v1, "a whole read recovers from a stale ETag");
}

fn chunk_files(cache_dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    crate::common::files::files_below(&cache_dir.join("v1/chunks"))
}

#[test]
fn corrupt_truncated_and_empty_chunk_files_are_refetched_and_counted() {
    let bucket = moto().bucket("corrupt");
    // Large chunks go by descriptor (checked by the shim), small ones inline (checked by the proxy).
    for (name, cs, size) in [("big", 1u64 << 20, 6usize << 20), ("small", CS, 6 * CS as usize)] {
        let want = pattern(60 + cs, size);
        moto().put(&bucket, name, &want);
        let fleet = Fleet::start(2, &[]);
        let client = fleet.client(cs);
        let url = format!("s3://{bucket}/{name}");
        assert_eq!(client.read(&url).unwrap(), want);
        let gets = moto().gets_settled(&bucket);
        let files = chunk_files(&fleet.cache_dir);
        assert_eq!(files.len(), 6, "one file per chunk");
        // Flip a data byte, a header byte, truncate one, empty one.
        let mut damaged = 0;
        for (i, f) in files.iter().enumerate().take(4) {
            let mut bytes = std::fs::read(f).unwrap();
            match i {
                0 => *bytes.last_mut().unwrap() ^= 0x40,
                1 => bytes[10] ^= 1,
                2 => bytes.truncate(bytes.len() - 100),
                _ => bytes.clear(),
            }
            std::fs::write(f, &bytes).unwrap();
            damaged += 1;
        }
        // Foreign files are ignored.
        std::fs::write(fleet.cache_dir.join("v1/chunks/not-a-chunk"), b"hello").unwrap();
        assert_eq!(client.read(&url).unwrap(), want, "{name}: damaged chunks served bad bytes");
        assert_eq!(
            moto().gets_settled(&bucket),
            gets + damaged,
            "{name}: each damaged chunk re-fetched once"
        );
        assert_eq!(fleet.total("corrupt_chunks"), damaged as u64, "{name}");
        assert_eq!(client.read(&url).unwrap(), want);
        assert_eq!(moto().gets_settled(&bucket), gets + damaged, "{name}: repaired chunks are cached again");
    }
}
