//! `memarts cat` and `memarts stat`, through a running fleet and straight from the origin.

use crate::common::{moto, pattern, text, Fleet};

#[test]
fn cat_and_stat_work_through_the_fleet_and_without_one() {
    let bucket = moto().bucket("cli");
    let want = pattern(300, (3 << 20) + 17);
    moto().put(&bucket, "dir/obj.bin", &want);
    let url = format!("oss://{bucket}/dir/obj.bin");
    let fleet = Fleet::start(2, &[]);
    for through_fleet in [true, false] {
        if !through_fleet {
            fleet.stop_proxy();
        }
        let out = fleet.memarts(&["cat", &url]);
        assert!(out.status.success(), "cat: {}", text(&out.stderr));
        assert!(out.stdout == want, "cat output differs (through fleet: {through_fleet})");
        let out = fleet.memarts(&["stat", "--json", &url]);
        assert!(out.status.success(), "stat: {}", text(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["size"], want.len() as u64);
        assert!(v["etag"].as_str().is_some_and(|e| !e.is_empty()));
        let out = fleet.memarts(&["cat", &format!("s3://{bucket}/nope")]);
        assert!(!out.status.success());
        assert!(text(&out.stderr).contains("not found"), "{}", text(&out.stderr));
    }
}
