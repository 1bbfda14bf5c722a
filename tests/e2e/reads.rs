//! Byte-exact reads of every size class through the fleet.

use crate::common::{moto, pattern, Fleet};

const CS: u64 = 64 << 10;

#[test]
fn byte_exact_reads_of_every_size_class() {
    let bucket = moto().bucket("sizes");
    let sizes = [0usize, 1, CS as usize - 1, CS as usize, CS as usize + 1, 7 * CS as usize + 123];
    for (i, size) in sizes.iter().enumerate() {
        moto().put(&bucket, &format!("obj-{i}"), &pattern(i as u64, *size));
    }
    let fleet = Fleet::start(3, &[]);
    let client = fleet.client(CS);
    for (i, size) in sizes.iter().enumerate() {
        let url = format!("s3://{bucket}/obj-{i}");
        let want = pattern(i as u64, *size);
        for pass in 0..2 {
            let got = client.read(&url).unwrap_or_else(|e| panic!("{url} pass {pass}: {e}"));
            assert!(got == want, "{url} ({size} bytes) differs on pass {pass}");
        }
        // Ranges that start and end inside chunks.
        if *size > 10 {
            let (off, len) = (*size as u64 / 3, *size / 2);
            let got = client.read_range(&url, off, len).unwrap();
            assert_eq!(got, want[off as usize..(off as usize + len).min(*size)]);
        }
        let meta = client.stat(&url).unwrap();
        assert_eq!(meta.size, *size as u64);
    }
    // obs:// and oss:// name the same bucket on the same endpoint.
    let got = client.read(&format!("obs://{bucket}/obj-2")).unwrap();
    assert_eq!(got, pattern(2, sizes[2]));
    let err = client.read(&format!("s3://{bucket}/missing")).unwrap_err();
    assert!(matches!(err, memarts_shim::Error::NotFound(_)), "{err}");
}

#[test]
fn a_100_mib_object_reads_byte_exact_with_1_mib_chunks() {
    let bucket = moto().bucket("big");
    let want = pattern(100, 100 << 20);
    moto().put(&bucket, "big.bin", &want);
    let fleet = Fleet::start(2, &[]);
    let client = fleet.client(1 << 20);
    let url = format!("s3://{bucket}/big.bin");
    assert!(client.read(&url).unwrap() == want, "cold read differs");
    assert!(client.read(&url).unwrap() == want, "warm read differs");
    client.send_read_reports();
    assert_eq!(fleet.total("misses"), 100);
    assert!(fleet.total("hits") >= 100);
}

#[test]
fn local_files_are_an_origin_too() {
    let fleet = Fleet::start(2, &[]);
    let path = fleet.dir.path().join("local.bin");
    let want = pattern(7, 3 * CS as usize + 5);
    std::fs::write(&path, &want).unwrap();
    let client = fleet.client(CS);
    for url in [path.display().to_string(), format!("file://{}", path.display())] {
        assert_eq!(client.read(&url).unwrap(), want);
    }
    let listed = client.list(&fleet.dir.path().display().to_string(), false).unwrap();
    assert!(
        listed.iter().any(|e| e.url.ends_with("/local.bin") && e.size == want.len() as u64),
        "{listed:?}"
    );
}

#[test]
fn list_pages_through_a_prefix() {
    let bucket = moto().bucket("list");
    for i in 0..1205 {
        moto().put(&bucket, &format!("data/part-{i:05}"), b"x");
    }
    moto().put(&bucket, "data/sub/inner", b"y");
    let fleet = Fleet::start(2, &[]);
    let client = fleet.client(CS);
    let all = client.list(&format!("s3://{bucket}/data"), true).unwrap();
    assert_eq!(all.len(), 1206);
    let top = client.list(&format!("s3://{bucket}/data"), false).unwrap();
    assert_eq!(top.len(), 1206, "1205 files and one directory");
    assert!(top.iter().any(|e| e.is_dir && e.url.ends_with("data/sub")), "{:?}", &top[..3]);
}
