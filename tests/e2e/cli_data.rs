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
        // A reader that goes away early (`| head -c`): cat stops quietly, with success, as before.
        let mut child =
            fleet.command(&["cat", &url]).stdout(std::process::Stdio::piped()).spawn().expect("spawn cat");
        let mut head = [0u8; 10];
        std::io::Read::read_exact(child.stdout.as_mut().unwrap(), &mut head).unwrap();
        assert_eq!(head[..], want[..10]);
        drop(child.stdout.take());
        let status = child.wait().unwrap();
        assert!(status.success(), "cat on a broken pipe: {status}");
        let out = fleet.memarts(&["cat", &format!("s3://{bucket}/nope")]);
        assert!(!out.status.success());
        assert!(text(&out.stderr).contains("not found"), "{}", text(&out.stderr));
    }
}

/// `memarts cat | tool`: the pipe is widened to a chunk (1 MiB), so a chunk crosses it in one
/// hand-over rather than sixteen of the default 64 KiB; the bytes are the object's.
#[test]
fn cat_into_a_pipe_widens_the_pipe_to_a_chunk() {
    use std::io::Read;
    use std::os::fd::AsFd;
    let bucket = moto().bucket("catpipe");
    let want = pattern(301, (2 << 20) + 5);
    moto().put(&bucket, "obj.bin", &want);
    let fleet = Fleet::start(2, &[]);
    let url = format!("s3://{bucket}/obj.bin");
    let mut child =
        fleet.command(&["cat", &url]).stdout(std::process::Stdio::piped()).spawn().expect("spawn cat");
    let mut stdout = child.stdout.take().unwrap();
    let mut got = Vec::new();
    stdout.read_to_end(&mut got).unwrap();
    assert!(child.wait().unwrap().success());
    assert!(got == want, "cat output differs");
    let size = nix::fcntl::fcntl(stdout.as_fd(), nix::fcntl::FcntlArg::F_GETPIPE_SZ).unwrap();
    assert_eq!(size, 1 << 20, "the pipe's capacity after memarts cat wrote into it");
}

#[test]
fn ls_and_cp_through_the_fleet_fill_the_cache() {
    let bucket = moto().bucket("cp");
    let files: Vec<(String, Vec<u8>)> = (0..25)
        .map(|i| (format!("set/{}/f{i:02}.bin", i % 3), pattern(600 + i, 10_000 + 7919 * i as usize)))
        .collect();
    for (key, data) in &files {
        moto().put(&bucket, key, data);
    }
    let fleet = Fleet::start(2, &[]);
    let out = fleet.memarts(&["ls", &format!("obs://{bucket}/set")]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let listed = text(&out.stdout);
    assert_eq!(listed.lines().count(), 3, "three directories one level down: {listed}");
    let out = fleet.memarts(&["ls", "-r", "-l", &format!("obs://{bucket}/set")]);
    assert_eq!(text(&out.stdout).lines().count(), 25);

    let dst = fleet.dir.path().join("download");
    let out = fleet.memarts(&["cp", "-r", &format!("obs://{bucket}/set"), dst.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    for (key, data) in &files {
        let got = std::fs::read(dst.join(key.trim_start_matches("set/"))).unwrap();
        assert!(got == *data, "{key} differs");
    }
    let gets = moto().gets_settled(&bucket);
    assert!(fleet.total("misses") > 0);
    // A second copy is served from the cache.
    let again = fleet.dir.path().join("again");
    std::fs::create_dir(&again).unwrap();
    let out = fleet.memarts(&["cp", &format!("obs://{bucket}/set/1/f01.bin"), again.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(std::fs::read(again.join("f01.bin")).unwrap(), files[1].1);
    assert_eq!(moto().gets_settled(&bucket), gets, "the second copy reached the origin");
    let leftovers: Vec<_> = std::fs::read_dir(&again).unwrap().flatten().map(|e| e.file_name()).collect();
    assert_eq!(leftovers.len(), 1, "temp files left behind: {leftovers:?}");
    // Uploads: a file, then a whole directory, read back through the fleet.
    let out = fleet.memarts(&[
        "cp",
        again.join("f01.bin").to_str().unwrap(),
        &format!("obs://{bucket}/up/one.bin"),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(fleet.client(64 << 10).read(&format!("s3://{bucket}/up/one.bin")).unwrap(), files[1].1);
    let out = fleet.memarts(&["cp", "-r", dst.to_str().unwrap(), &format!("obs://{bucket}/mirror")]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    for (key, data) in &files {
        let url = format!("s3://{bucket}/mirror/{}", key.trim_start_matches("set/"));
        assert!(fleet.client(64 << 10).read(&url).unwrap() == *data, "{url} differs");
    }
}

#[test]
fn put_stores_at_the_origin_or_in_the_cache_only() {
    let bucket = moto().bucket("put");
    let fleet = Fleet::start(2, &[]);
    let file = fleet.dir.path().join("f.bin");
    let data = pattern(800, 300_000);
    std::fs::write(&file, &data).unwrap();
    let url = format!("obs://{bucket}/p/f.bin");
    let out = fleet.memarts(&["put", &url, file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(fleet.client(64 << 10).read(&url).unwrap(), data);
    let only = format!("obs://{bucket}/p/only.bin");
    let out = fleet.memarts(&["put", "--memarts-only", &only, file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        matches!(fleet.client(64 << 10).stat(&only), Err(memarts_shim::Error::NotFound(_))),
        "memarts-only reached the origin"
    );
    let mut sink = memarts_shim::VecSink::default();
    fleet.client(64 << 10).read_memarts_to(&only, &mut sink).unwrap();
    // SAFETY: read_memarts_to returned Ok, so every reserved byte was written.
    assert_eq!(unsafe { sink.finish() }, data);
    fleet.stop_proxy();
    let out = fleet.memarts(&["put", "--memarts-only", &only, file.to_str().unwrap()]);
    assert!(!out.status.success() && text(&out.stderr).contains("running fleet"), "{}", text(&out.stderr));
}

#[test]
fn origin_requests_are_logged_per_slot_without_credentials() {
    let bucket = moto().bucket("log");
    moto().put(&bucket, "o", &pattern(900, 200_000));
    let fleet = Fleet::start(1, &[]);
    // Until its index is rebuilt a slot cannot tell a cold object, and asks with a HEAD first.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !fleet.status()["slots"][0]["index_ready"].as_bool().unwrap_or(false) {
        assert!(std::time::Instant::now() < deadline, "the index was never ready");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    fleet.client(64 << 10).read(&format!("obs://{bucket}/o")).unwrap();
    let log = std::fs::read_to_string(fleet.run_dir.join("origin-0.log")).unwrap();
    // A cold read: chunk 0 and the metadata in one GET (no version to pin yet), then the other
    // chunks pinned to the ETag it reported.
    let gets: Vec<&str> = log.lines().filter(|l| l.contains(" GET s3://")).collect();
    assert!(gets[0].contains("bytes=0-65535 attempt=1 ok") && !gets[0].contains("if-match"), "{log}");
    assert!(gets[1..].iter().all(|l| l.contains("if-match=") && l.contains("attempt=1 ok")), "{log}");
    assert_eq!(log.lines().filter(|l| l.contains(" GET s3://")).count(), 4, "{log}");
    assert!(!log.contains("testing"), "credentials in the request log: {log}");
    fleet.stop_proxy();
    let quiet = Fleet::start(1, &[("MOX_OBS_CLIENT_LOG", "0")]);
    quiet.client(64 << 10).read(&format!("obs://{bucket}/o")).unwrap();
    assert!(!quiet.run_dir.join("origin-0.log").exists());
    let out = quiet.memarts(&["stop_proxy"]);
    assert!(out.status.success());
    let bad = std::process::Command::new(crate::common::fleet::memarts_bin())
        .args(["start_proxy", "1"])
        .env("MEMARTS_RUN_DIR", quiet.dir.path().join("run2"))
        .env("MOX_OBS_CLIENT_LOG", "yes")
        .output()
        .unwrap();
    assert!(
        !bad.status.success() && text(&bad.stderr).contains("MOX_OBS_CLIENT_LOG"),
        "{}",
        text(&bad.stderr)
    );
}

#[test]
fn warmup_fills_the_cache_and_honours_a_rate_cap() {
    let bucket = moto().bucket("warmup");
    for i in 0..8 {
        moto().put(&bucket, &format!("w/{i}"), &pattern(950 + i, 512 << 10));
    }
    let fleet = Fleet::start(2, &[]);
    let prefix = format!("obs://{bucket}/w");
    let out = fleet.memarts(&["warmup", "--max-rate", "nonsense", &prefix]);
    assert!(!out.status.success() && text(&out.stderr).contains("--max-rate"), "{}", text(&out.stderr));
    // 4 MiB at 8 MiB/s cannot take less than half a second (a lower bound: the cap works).
    let started = std::time::Instant::now();
    let out = fleet.memarts(&["warmup", "--max-rate", "8MiB", &prefix]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(started.elapsed() >= std::time::Duration::from_millis(450), "{:?}", started.elapsed());
    assert!(text(&out.stdout).contains("0 from cache"), "{}", text(&out.stdout));
    let gets = moto().gets_settled(&bucket);
    let out = fleet.memarts(&["warmup", &prefix]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("0 from origin"), "{}", text(&out.stdout));
    assert_eq!(moto().gets_settled(&bucket), gets);
}

/// `memarts warmup` fetches each chunk once (one GET for a small object's metadata and data), and
/// the fleet keeps the metadata too: reading everything afterwards asks the origin nothing, not
/// even a HEAD. Objects larger than a read window are read in windows, byte-exact.
#[test]
fn warmup_fetches_each_chunk_once_and_leaves_the_next_epoch_nothing_to_ask() {
    const MIB: usize = 1 << 20;
    let bucket = moto().bucket("warmall");
    let mut objects = Vec::new();
    for i in 0..10u64 {
        objects.push((format!("d/small-{i}"), pattern(4000 + i, 100 << 10)));
    }
    objects.push(("d/medium".to_string(), pattern(4100, 3 * MIB + 5)));
    objects.push(("d/deep/large".to_string(), pattern(4101, 20 * MIB + 3)));
    for (key, data) in &objects {
        moto().put(&bucket, key, data);
    }
    let chunks: usize = objects.iter().map(|(_, d)| d.len().div_ceil(MIB)).sum();
    let fleet = Fleet::start(2, &[("MOX_FILE_CHUNK_SIZE", "1048576")]);
    fleet.wait_index_ready();
    let lists = |b: &str| moto().requests(&format!("GET /{b}?"));
    let heads = |b: &str| moto().requests(&format!("HEAD /{b}/"));
    let out = fleet.memarts(&["warmup", "--threads", "8", &format!("s3://{bucket}/d/")]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("read 12 objects"), "{}", text(&out.stdout));
    assert_eq!(moto().gets_settled(&bucket), chunks, "one GET per chunk");
    assert_eq!(lists(&bucket), 1, "one LIST for the run");
    let heads_after_warmup = heads(&bucket);
    let client = fleet.client(MIB as u64);
    for (key, data) in &objects {
        assert!(client.read(&format!("s3://{bucket}/{key}")).unwrap() == *data, "{key}");
    }
    assert_eq!(moto().gets_settled(&bucket), chunks, "the epoch after the warmup fetched something");
    assert_eq!(heads(&bucket), heads_after_warmup, "the epoch after the warmup asked for metadata");

    // From a manifest: no LIST at all; keys relative to the prefix, URLs as they are, comments.
    let other = moto().bucket("warmmanifest");
    moto().put(&other, "m/a", &pattern(4200, 300 << 10));
    moto().put(&other, "m/b/c", &pattern(4201, 2 * MIB));
    moto().put(&other, "elsewhere", &pattern(4202, 10));
    let manifest = fleet.dir.path().join("manifest.txt");
    let listing = format!("# the training set\na 1\nb/c\n\ns3://{other}/elsewhere\n");
    std::fs::write(&manifest, listing).unwrap();
    let out =
        fleet.memarts(&["warmup", "--manifest", manifest.to_str().unwrap(), &format!("s3://{other}/m")]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("read 3 objects"), "{}", text(&out.stdout));
    assert_eq!(lists(&other), 0, "a manifest needs no LIST");
    assert_eq!(moto().gets_settled(&other), 1 + 2 + 1);
    let missing = fleet.dir.path().join("missing.txt");
    std::fs::write(&missing, "a\nnot-there\n").unwrap();
    let out = fleet.memarts(&["warmup", "--manifest", missing.to_str().unwrap(), &format!("s3://{other}/m")]);
    assert!(!out.status.success(), "a missing object is a failure");
    assert!(
        text(&out.stderr).contains("not-there") && text(&out.stderr).contains("1 of 2"),
        "{}",
        text(&out.stderr)
    );
}

/// A LIST of more than one page is read while it is listed: the objects of the first page are
/// fetched before the last page has come, instead of after it (the slots' origin logs give each
/// request's end and duration). One LIST in all still, and every object read once.
#[test]
fn warmup_reads_the_first_page_of_the_listing_while_the_rest_is_listed() {
    // Two full pages of a LIST: moto takes ~0.3 s to list a page of 1,000, a window in which the
    // readers start on the first page.
    const OBJECTS: usize = 2000;
    let bucket = moto().bucket("warmpages");
    moto().put_many(&bucket, (0..OBJECTS).map(|i| (format!("p/{i:04}"), pattern(5000 + i as u64, 1000))));
    let fleet = Fleet::start(2, &[]);
    fleet.wait_index_ready();
    let out = fleet.memarts(&["warmup", &format!("s3://{bucket}/p/")]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains(&format!("read {OBJECTS} objects")), "{}", text(&out.stdout));
    assert!(text(&out.stderr).contains("read while listing"), "{}", text(&out.stderr));
    assert_eq!(moto().gets_settled(&bucket), OBJECTS, "one GET per object");
    // `<end time> <op> <target> attempt=N <outcome> <took>ms`, from every slot: (start, end, op).
    let mut requests: Vec<(f64, f64, String)> = (0..2)
        .flat_map(|slot| {
            std::fs::read_to_string(fleet.run_dir.join(format!("origin-{slot}.log")))
                .unwrap_or_default()
                .lines()
                .map(|l| {
                    let f: Vec<&str> = l.split_whitespace().collect();
                    let end: f64 = f[0].parse().unwrap();
                    let took: f64 = f[f.len() - 1].trim_end_matches("ms").parse().unwrap();
                    (end - took / 1000.0, end, f[1].to_string())
                })
                .collect::<Vec<_>>()
        })
        .collect();
    requests.sort_by(|a, b| a.0.total_cmp(&b.0));
    let lists: Vec<f64> = requests.iter().filter(|(_, _, op)| op.starts_with("LIST")).map(|r| r.1).collect();
    assert_eq!(lists.len(), 2, "one LIST, of two pages: {requests:?}");
    // Started while the last page was still to come (ends depend on the machine's load; a warmup
    // that listed first would start no GET before the last page ended).
    let started_before_last_page =
        requests.iter().filter(|(start, _, op)| op == "GET" && *start < lists[1]).count();
    assert!(started_before_last_page > 0, "nothing was read before the listing ended: {:?}", &requests[..10]);
}

/// On a terminal, `memarts warmup` draws its progress: bytes done of the total, the rate and an
/// ETA (and draws nothing into a pipe or a log: the other tests read its plain output).
#[test]
fn warmup_shows_progress_with_rate_and_eta_on_a_terminal() {
    use std::io::Read;
    let bucket = moto().bucket("warmtty");
    for i in 0..6 {
        moto().put(&bucket, &format!("p/{i}"), &pattern(4300 + i, 256 << 10));
    }
    let fleet = Fleet::start(1, &[]);
    let pty = nix::pty::openpty(None, None).expect("openpty");
    // The command holds the terminal's side until it is dropped: then the child's exit closes it.
    let child = fleet
        .command(&["warmup", "--max-rate", "1MiB", &format!("s3://{bucket}/p")])
        .stderr(std::process::Stdio::from(pty.slave))
        .output()
        .expect("run memarts");
    assert!(child.status.success(), "{}", text(&child.stdout));
    let mut drawn = Vec::new();
    let mut master = std::fs::File::from(pty.master);
    // The child has exited and closed its side: read what it drew until the pty says EIO.
    let mut buf = [0u8; 4096];
    while let Ok(n) = master.read(&mut buf) {
        if n == 0 {
            break;
        }
        drawn.extend_from_slice(&buf[..n]);
    }
    let drawn = text(&drawn);
    assert!(drawn.contains("ETA") && drawn.contains("/s") && drawn.contains("1.50 MiB"), "{drawn:?}");
    assert!(!text(&child.stdout).contains("ETA"), "progress goes to the terminal only");
}

/// `memarts ls -r` and `memarts warmup` of a local tree of 5 × 1,000 files, with a fleet and without
/// one: 5,000 entries, each once (pages of 1,000 used to continue in a different order than the one
/// before, and listed 3,668 entries, 2,813 of them distinct).
#[test]
fn ls_and_warmup_of_a_local_tree_list_every_file_once() {
    let fleet = Fleet::start(2, &[]);
    let tree = fleet.dir.path().join("tree");
    for d in 0..5 {
        std::fs::create_dir_all(tree.join(format!("d{d}"))).unwrap();
        for i in 0..1000 {
            std::fs::write(tree.join(format!("d{d}/f{i}")), format!("{d}-{i}")).unwrap();
        }
    }
    let root = tree.to_str().unwrap();
    for through_fleet in [true, false] {
        if !through_fleet {
            fleet.stop_proxy();
        }
        let out = fleet.memarts(&["ls", "-r", root]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let listed: Vec<String> = text(&out.stdout).lines().map(str::to_string).collect();
        let distinct: std::collections::BTreeSet<&String> = listed.iter().collect();
        assert_eq!((listed.len(), distinct.len()), (5000, 5000), "through the fleet: {through_fleet}");
        assert!(distinct.iter().all(|p| std::path::Path::new(p.as_str()).is_file()));
    }
    fleet.start_proxy(2);
    let out = fleet.memarts(&["warmup", root]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("read 5000 objects"), "{}", text(&out.stdout));
}
