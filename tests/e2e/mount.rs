//! `memarts mount`: a real FUSE mount of a moto bucket through a real fleet, read and written by
//! real tools (`cat`, `dd`) and std::fs, with the origin and the fleet's counters as witnesses.

use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::common::files::files_below;
use crate::common::mount::is_mounted;
use crate::common::{moto, pattern, text, Fleet};

const CS: usize = 64 << 10;
const ENV: &[(&str, &str)] = &[("MOX_FILE_CHUNK_SIZE", "65536")];

fn errno(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or_else(|| panic!("no errno in {e}"))
}

fn read_at(path: &std::path::Path, offset: u64, len: usize) -> Vec<u8> {
    let mut f = std::fs::File::open(path).unwrap();
    f.seek(SeekFrom::Start(offset)).unwrap();
    let mut buf = Vec::new();
    f.take(len as u64).read_to_end(&mut buf).unwrap();
    buf
}

#[test]
fn every_size_class_reads_byte_exact_with_cat_dd_and_seeks_and_again_from_the_cache() {
    let bucket = moto().bucket("mnt-sizes");
    let sizes = [0, 1, CS - 1, CS, CS + 1, 7 * CS + 123, 24 << 20];
    for (i, size) in sizes.iter().enumerate() {
        moto().put(&bucket, &format!("set/f{i}.bin"), &pattern(900 + i as u64, *size));
    }
    let fleet = Fleet::start(2, ENV);
    for pass in 0..2 {
        let m = fleet.mount(&format!("s3://{bucket}/set"), &[]);
        let gets_before = moto().gets_settled(&bucket);
        for (i, size) in sizes.iter().enumerate() {
            let want = pattern(900 + i as u64, *size);
            let path = m.path(&format!("f{i}.bin"));
            assert_eq!(std::fs::metadata(&path).unwrap().len(), *size as u64);
            let out = Command::new("cat").arg(&path).output().unwrap();
            assert!(out.status.success(), "cat: {}", text(&out.stderr));
            assert!(out.stdout == want, "cat of f{i} ({size} bytes) differs on pass {pass}");
            if *size > 10 {
                // dd with skip/count in 4 KiB blocks, starting inside a chunk.
                let (skip, count) = (*size / 3 / 4096, (*size / 2).div_ceil(4096));
                let out = Command::new("dd")
                    .arg(format!("if={}", path.display()))
                    .args(["bs=4096", &format!("skip={skip}"), &format!("count={count}"), "status=none"])
                    .output()
                    .unwrap();
                assert!(out.status.success(), "dd: {}", text(&out.stderr));
                let from = (skip * 4096).min(*size);
                let to = (from + count * 4096).min(*size);
                assert!(out.stdout == want[from..to], "dd of f{i} skip={skip} count={count} differs");
                // std::fs reads at offsets that straddle chunk boundaries, and past the end.
                for (off, len) in [(*size as u64 / 2, 3 * CS), (CS as u64 - 7, 14), (*size as u64 - 1, 100)] {
                    let o = (off as usize).min(*size);
                    assert_eq!(read_at(&path, off, len), want[o..(o + len).min(*size)], "f{i} at {off}");
                }
                assert!(read_at(&path, *size as u64 + 5, 10).is_empty(), "a read past the end");
            }
        }
        if pass == 1 {
            // A new mount (no page cache left): every byte came from the fleet's cache (read by the
            // mount straight from the chunk files, local hits it reports to the slots later, or
            // through the slots).
            assert_eq!(moto().gets_settled(&bucket), gets_before, "the second pass reached the origin");
        } else {
            fleet.wait_cached(((24 << 20) / CS) as u64);
        }
    }
}

#[test]
fn listings_walk_the_tree_missing_names_are_enoent_and_stat_comes_from_the_origin() {
    let bucket = moto().bucket("mnt-list");
    let keys = ["a.txt", "d1/b.txt", "d1/d2/c.txt", "d1/d2/d3/e.txt", "odd name+1.txt"];
    for (i, k) in keys.iter().enumerate() {
        moto().put(&bucket, &format!("root/{k}"), &pattern(i as u64, 100 + i));
    }
    // A name no file system has (longer than 255 bytes) is left out, not fatal.
    moto().put(&bucket, &format!("root/{}", "n".repeat(300)), b"long");
    let fleet = Fleet::start(2, ENV);
    let m = fleet.mount(&format!("s3://{bucket}/root"), &["--negative-timeout", "6", "--entry-timeout", "1"]);
    let walked: Vec<String> = files_below(&m.point)
        .iter()
        .map(|p| p.strip_prefix(&m.point).unwrap().display().to_string())
        .collect();
    assert_eq!(walked, keys);
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(std::fs::read(m.path(k)).unwrap(), pattern(i as u64, 100 + i), "{k}");
    }
    let meta = std::fs::metadata(m.path("d1/d2/c.txt")).unwrap();
    let origin = fleet.client(CS as u64).stat(&format!("s3://{bucket}/root/d1/d2/c.txt")).unwrap();
    assert_eq!(meta.len(), origin.size);
    assert_eq!(meta.mtime(), origin.last_modified_ms / 1000, "mtime is the origin's");
    assert_eq!(meta.mode() & 0o777, 0o644);
    assert_eq!((meta.uid(), meta.gid()), (nix::unistd::getuid().as_raw(), nix::unistd::getgid().as_raw()));
    assert_eq!(std::fs::metadata(m.path("d1")).unwrap().mode() & 0o777, 0o755);

    // Missing, then created at the origin: still missing within the negative timeout (6 s: room for
    // a slow put on a loaded machine), then found.
    let err = std::fs::metadata(m.path("late.txt")).unwrap_err();
    assert_eq!(errno(&err), libc::ENOENT);
    moto().put(&bucket, "root/late.txt", b"late");
    assert_eq!(errno(&std::fs::metadata(m.path("late.txt")).unwrap_err()), libc::ENOENT, "negative cache");
    std::thread::sleep(Duration::from_millis(6500));
    assert_eq!(std::fs::read(m.path("late.txt")).unwrap(), b"late");
    let names: Vec<String> =
        std::fs::read_dir(&m.point).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    assert!(names.contains(&"late.txt".to_string()), "{names:?}");
    assert!(is_mounted(&m.point), "the mount survived the odd names");
}

#[test]
fn a_replaced_object_is_never_served_mixed_and_is_seen_new_after_the_attr_timeout() {
    let bucket = moto().bucket("mnt-replace");
    let (v1, v2) = (pattern(1, 12 * CS), pattern(2, 12 * CS));
    moto().put(&bucket, "obj", &v1);
    let fleet = Fleet::start(2, ENV);
    let m = fleet.mount(&format!("s3://{bucket}"), &["--attr-timeout", "2", "--entry-timeout", "2"]);
    let path = m.path("obj");
    let mut open = std::fs::File::open(&path).unwrap();
    let mut first = vec![0u8; CS];
    open.read_exact(&mut first).unwrap();
    assert_eq!(first, v1[..CS]);
    moto().put(&bucket, "obj", &v2);
    // The open file goes on with v1 (cached or read ahead) or fails with ESTALE: never v2's bytes.
    let mut rest = Vec::new();
    match open.read_to_end(&mut rest) {
        Ok(_) => assert!(rest == v1[CS..], "an open file mixed versions"),
        Err(e) => assert_eq!(errno(&e), libc::ESTALE, "{e}"),
    }
    std::thread::sleep(Duration::from_millis(2500));
    let got = std::fs::read(&path).unwrap();
    assert!(got == v2, "after the attr timeout a new open reads the new version");
}

#[test]
fn writes_appear_at_the_origin_byte_exact_on_close_and_what_cannot_be_done_is_refused() {
    let bucket = moto().bucket("mnt-write");
    let fleet = Fleet::start(2, ENV);
    let client = fleet.client(CS as u64);
    let m = fleet.mount(&format!("s3://{bucket}/w"), &["--attr-timeout", "1", "--entry-timeout", "1"]);
    std::fs::create_dir(m.path("out")).unwrap();
    // A large file: a multipart upload (parts of 8 MiB), visible only after close.
    let big = pattern(50, (20 << 20) + 3);
    let mut f = std::fs::File::create(m.path("out/big.bin")).unwrap();
    f.write_all(&big[..5 << 20]).unwrap();
    let url = format!("s3://{bucket}/w/out/big.bin");
    assert!(matches!(client.stat(&url), Err(memarts_shim::Error::NotFound(_))), "visible before close");
    f.write_all(&big[5 << 20..]).unwrap();
    drop(f);
    assert!(client.read(&url).unwrap() == big, "the uploaded object differs");
    assert!(std::fs::read(m.path("out/big.bin")).unwrap() == big, "reading it back through the mount");
    // Tools: cp and dd write whole files too.
    let local = fleet.dir.path().join("local.bin");
    std::fs::write(&local, pattern(51, 3 * CS + 9)).unwrap();
    let out = Command::new("cp").arg(&local).arg(m.path("out/cp.bin")).output().unwrap();
    assert!(out.status.success(), "cp: {}", text(&out.stderr));
    assert_eq!(client.read(&format!("s3://{bucket}/w/out/cp.bin")).unwrap(), pattern(51, 3 * CS + 9));
    // An existing object is replaced by open(O_TRUNC).
    std::fs::write(m.path("out/cp.bin"), b"shorter").unwrap();
    assert_eq!(client.read(&format!("s3://{bucket}/w/out/cp.bin")).unwrap(), b"shorter");

    // A random write is refused (EOPNOTSUPP), and the file is then not published at all.
    let mut f = std::fs::File::create(m.path("out/random.bin")).unwrap();
    f.write_all(b"0123456789").unwrap();
    f.seek(SeekFrom::Start(3)).unwrap();
    assert_eq!(errno(&f.write_all(b"x").unwrap_err()), libc::EOPNOTSUPP);
    let closed = unsafe_close(f);
    assert_eq!(closed, Some(libc::EOPNOTSUPP), "close reports the refused write");
    assert!(client.stat(&format!("s3://{bucket}/w/out/random.bin")).is_err(), "a refused file was published");
    // Appending to an existing object is refused too (objects are written whole).
    let err = std::fs::OpenOptions::new().append(true).open(m.path("out/big.bin")).unwrap_err();
    assert_eq!(errno(&err), libc::EOPNOTSUPP);
    // A second writer of one file is refused while the first is open.
    let first = std::fs::File::create(m.path("out/one.bin")).unwrap();
    let err = std::fs::File::create(m.path("out/one.bin")).unwrap_err();
    assert_eq!(errno(&err), libc::EPERM);
    drop(first);
    // unlink and rmdir.
    std::fs::remove_file(m.path("out/cp.bin")).unwrap();
    assert!(matches!(
        client.stat(&format!("s3://{bucket}/w/out/cp.bin")),
        Err(memarts_shim::Error::NotFound(_))
    ));
    assert_eq!(errno(&std::fs::remove_dir(m.path("out")).unwrap_err()), libc::ENOTEMPTY);
    std::fs::create_dir(m.path("empty")).unwrap();
    assert!(std::fs::metadata(m.path("empty")).unwrap().is_dir());
    std::fs::remove_dir(m.path("empty")).unwrap();
    assert_eq!(errno(&std::fs::metadata(m.path("empty")).unwrap_err()), libc::ENOENT);
    assert_eq!(
        errno(&std::fs::rename(m.path("out/big.bin"), m.path("out/b2")).unwrap_err()),
        libc::EOPNOTSUPP
    );
}

/// Closes `f` and returns the errno of close(2), if it failed.
fn unsafe_close(f: std::fs::File) -> Option<i32> {
    use std::os::fd::IntoRawFd;
    let fd = f.into_raw_fd();
    // SAFETY: `fd` was just taken from the File, so this is its only owner and it is closed once.
    let r = unsafe { libc::close(fd) };
    (r != 0).then(|| std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
}

#[test]
fn a_writer_killed_mid_write_publishes_nothing_and_a_read_only_mount_refuses_writes() {
    let bucket = moto().bucket("mnt-killed");
    moto().put(&bucket, "data/keep.bin", &pattern(3, 2 * CS));
    let fleet = Fleet::start(1, ENV);
    let client = fleet.client(CS as u64);
    let m = fleet.mount(&format!("s3://{bucket}/data"), &[]);
    let mut dd = Command::new("dd")
        .arg("if=/dev/zero")
        .arg(format!("of={}", m.path("killed.bin").display()))
        .args(["bs=65536", "status=none"])
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(700));
    kill(Pid::from_raw(dd.id() as i32), Signal::SIGKILL).unwrap();
    let _ = dd.wait();
    std::thread::sleep(Duration::from_millis(300));
    let url = format!("s3://{bucket}/data/killed.bin");
    assert!(
        matches!(client.stat_opts(&url, true), Err(memarts_shim::Error::NotFound(_))),
        "a killed writer published"
    );
    // The name is free again for a writer that finishes.
    std::fs::write(m.path("killed.bin"), b"done").unwrap();
    assert_eq!(client.read(&url).unwrap(), b"done");

    let ro = fleet.mount(&format!("s3://{bucket}/data"), &["--read-only"]);
    assert_eq!(errno(&std::fs::write(ro.path("new.bin"), b"x").unwrap_err()), libc::EROFS);
    assert_eq!(errno(&std::fs::remove_file(ro.path("keep.bin")).unwrap_err()), libc::EROFS);
    let meta = std::fs::metadata(ro.path("keep.bin")).unwrap();
    assert_eq!(meta.mode() & 0o777, 0o444);
    assert_eq!(std::fs::metadata(&ro.point).unwrap().mode() & 0o777, 0o555);
    assert_eq!(std::fs::read(ro.path("keep.bin")).unwrap(), pattern(3, 2 * CS));
}

#[test]
fn kill_9_of_a_proxy_slot_while_the_mount_is_read_pauses_reads_that_then_complete() {
    let bucket = moto().bucket("mnt-kill-slot");
    let objects: Arc<Vec<Vec<u8>>> = Arc::new((0..48).map(|i| pattern(70 + i, 5 * CS + 17)).collect());
    for (i, o) in objects.iter().enumerate() {
        moto().put(&bucket, &format!("o{i}"), o);
    }
    let fleet = Fleet::start(3, ENV);
    let m = Arc::new(fleet.mount(&format!("s3://{bucket}"), &[]));
    let next = Arc::new(AtomicUsize::new(0));
    let started = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..4)
        .map(|_| {
            let (m, objects, next, started) = (m.clone(), objects.clone(), next.clone(), started.clone());
            std::thread::spawn(move || loop {
                let k = next.fetch_add(1, Ordering::SeqCst);
                if k >= objects.len() {
                    return;
                }
                started.store(true, Ordering::SeqCst);
                // Each object is read once, so every read reaches the fleet (no page cache).
                let got = std::fs::read(m.path(&format!("o{k}"))).unwrap_or_else(|e| panic!("o{k}: {e}"));
                assert!(got == objects[k], "o{k} differs");
                std::thread::sleep(Duration::from_millis(30));
            })
        })
        .collect();
    while !started.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(150));
    kill(Pid::from_raw(fleet.pid(1)), Signal::SIGKILL).unwrap();
    let at_kill = next.load(Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(500));
    fleet.recover(3);
    for r in readers {
        r.join().expect("a read through the mount failed");
    }
    assert!(at_kill < objects.len(), "the slot was killed after every read had started");
}

#[test]
fn unmount_ends_the_mount_and_cleans_a_stale_one_left_by_kill_9() {
    let bucket = moto().bucket("mnt-unmount");
    moto().put(&bucket, "a", b"a");
    let fleet = Fleet::start(1, ENV);
    let m = fleet.mount(&format!("s3://{bucket}"), &[]);
    assert_eq!(std::fs::read(m.path("a")).unwrap(), b"a");
    let out = m.unmount(&[]);
    assert!(out.status.success(), "unmount: {}", text(&out.stderr));
    assert!(!is_mounted(&m.point));
    assert!(m.wait_exit(Duration::from_secs(10)), "the mount process outlived its unmount");

    let m = fleet.mount(&format!("s3://{bucket}"), &[]);
    kill(Pid::from_raw(m.pid), Signal::SIGKILL).unwrap();
    assert!(m.wait_exit(Duration::from_secs(10)));
    let stale = errno(&std::fs::metadata(&m.point).unwrap_err());
    assert!([libc::ENOTCONN, libc::ECONNABORTED].contains(&stale), "a stale mount gave errno {stale}");
    let out = m.unmount(&[]);
    assert!(out.status.success(), "unmount of a stale mount: {}", text(&out.stderr));
    assert!(text(&out.stdout).contains("had died"), "{}", text(&out.stdout));
    assert!(!is_mounted(&m.point) && std::fs::read_dir(&m.point).unwrap().next().is_none());
    let out = m.unmount(&[]);
    assert!(
        !out.status.success() && text(&out.stderr).contains("nothing is mounted"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn without_a_fleet_mount_says_how_to_start_one_or_runs_the_engine_embedded() {
    let bucket = moto().bucket("mnt-nofleet");
    let want = pattern(8, 3 * CS + 1);
    moto().put(&bucket, "x.bin", &want);
    let fleet = Fleet::new(ENV);
    let point = fleet.dir.path().join("mnt");
    std::fs::create_dir(&point).unwrap();
    let out = fleet.memarts(&["mount", &format!("s3://{bucket}"), point.to_str().unwrap()]);
    assert!(!out.status.success(), "mounted without a fleet");
    let err = text(&out.stderr);
    assert!(err.contains("memarts start_proxy") && err.contains(fleet.run_dir.to_str().unwrap()), "{err}");
    assert!(!is_mounted(&point));
    let m = fleet.mount(&format!("s3://{bucket}"), &["--embedded"]);
    assert!(std::fs::read(m.path("x.bin")).unwrap() == want);
    let status = fleet.memarts(&["mount", "--help"]);
    let help = text(&status.stdout);
    for flag in [
        "--read-only",
        "--attr-timeout",
        "--entry-timeout",
        "--negative-timeout",
        "--kernel-cache",
        "--allow-other",
        "--foreground",
        "--embedded",
    ] {
        assert!(help.contains(flag), "--help does not explain {flag}");
    }
}

fn rss_kib(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

#[test]
fn memory_stays_bounded_with_hundreds_of_files_open_and_read_at_once() {
    let bucket = moto().bucket("mnt-many");
    let (n, size) = (300, 4 * CS);
    for i in 0..n {
        moto().put(&bucket, &format!("f{i}"), &pattern(5000 + i as u64, size));
    }
    let fleet = Fleet::start(2, ENV);
    let m = fleet.mount(&format!("s3://{bucket}"), &["--readahead-memory", "8MiB"]);
    // Warm: the cold fill is the fleet's business, not the mount's memory.
    let out = fleet.memarts(&["warmup", &format!("s3://{bucket}/")]);
    assert!(out.status.success(), "warmup: {}", text(&out.stderr));
    let base = rss_kib(m.pid);
    let mut files: Vec<std::fs::File> =
        (0..n).map(|i| std::fs::File::open(m.path(&format!("f{i}"))).unwrap()).collect();
    let mut got: Vec<Vec<u8>> = vec![Vec::with_capacity(size); n];
    let mut peak = base;
    let mut buf = vec![0u8; 16 << 10];
    for _round in 0..size / buf.len() {
        for (f, g) in files.iter_mut().zip(got.iter_mut()) {
            let k = f.read(&mut buf).unwrap();
            g.extend_from_slice(&buf[..k]);
        }
        peak = peak.max(rss_kib(m.pid));
    }
    for (i, g) in got.iter().enumerate() {
        assert!(*g == pattern(5000 + i as u64, size), "f{i} differs");
    }
    // All the data is 75 MiB; the mount may hold 8 MiB of chunks plus one chunk per kernel thread.
    let grew = peak.saturating_sub(base);
    assert!(grew < 40 << 10, "the mount grew by {grew} KiB with {n} files open (from {base} KiB)");
}

#[test]
fn odd_requests_get_an_errno_and_never_bring_the_mount_down() {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::FileExt;
    let bucket = moto().bucket("mnt-odd");
    let want = pattern(9, 3 * CS + 5);
    moto().put(&bucket, "f.bin", &want);
    let fleet = Fleet::start(1, ENV);
    let m = fleet.mount(&format!("s3://{bucket}"), &[]);
    let f = std::fs::File::open(m.path("f.bin")).unwrap();
    // Offsets past the end, at the largest offset there is, and reads far larger than the file.
    let mut buf = vec![0u8; 64 << 20];
    assert_eq!(f.read_at(&mut buf[..10], want.len() as u64).unwrap(), 0);
    assert_eq!(f.read_at(&mut buf[..10], i64::MAX as u64 - 10).unwrap(), 0);
    let mut got = Vec::new();
    let mut off = 0;
    loop {
        let n = f.read_at(&mut buf, off).unwrap();
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
        off += n as u64;
    }
    assert!(got == want, "a 64 MiB read buffer");
    // A memory map is served from the same reads.
    let out = Command::new("python3")
        .args(["-c", "import mmap,sys; f=open(sys.argv[1],'rb'); m=mmap.mmap(f.fileno(),0,prot=mmap.PROT_READ); sys.stdout.buffer.write(m[:])"])
        .arg(m.path("f.bin"))
        .output()
        .unwrap();
    assert!(out.status.success() && out.stdout == want, "mmap: {}", text(&out.stderr));
    // Names: not UTF-8, the longest allowed, one too long; and calls object stores have no answer for.
    let bad = std::ffi::OsStr::from_bytes(b"bad-\xff.bin");
    assert_eq!(errno(&std::fs::write(m.point.join(bad), b"x").unwrap_err()), libc::EINVAL);
    let longest = "l".repeat(255);
    std::fs::write(m.path(&longest), b"long").unwrap();
    assert_eq!(std::fs::read(m.path(&longest)).unwrap(), b"long");
    assert_eq!(errno(&std::fs::write(m.path(&"l".repeat(256)), b"x").unwrap_err()), libc::ENAMETOOLONG);
    assert!(std::os::unix::fs::symlink("f.bin", m.path("link")).is_err());
    assert!(std::fs::hard_link(m.path("f.bin"), m.path("hard")).is_err());
    assert!(std::fs::metadata(m.path("f.bin/inside")).is_err(), "a file is no directory");
    assert!(std::fs::read_dir(m.path("f.bin")).is_err());
    assert_eq!(errno(&std::fs::read(&m.point).unwrap_err()), libc::EISDIR);
    assert!(std::fs::OpenOptions::new().write(true).open(m.path("f.bin")).is_err(), "write without O_TRUNC");
    let sparse = Command::new("truncate").args(["-s", "1G"]).arg(m.path("f.bin")).output().unwrap();
    assert!(!sparse.status.success(), "truncate to another size was accepted");
    // Still serving, byte-exact.
    assert!(std::fs::read(m.path("f.bin")).unwrap() == want);
    assert!(crate::common::mount::alive(m.pid), "the mount process died");
}

#[test]
fn other_users_get_in_only_with_allow_other_and_the_kernel_checks_the_mode_bits() {
    use std::os::unix::fs::PermissionsExt;
    use std::path::Path;

    use crate::common::foreign::as_other_user;
    let bucket = moto().bucket("mnt-others");
    moto().put(&bucket, "f", b"shared");
    let fleet = Fleet::start(1, ENV);
    // Let uid 65534 reach the mount points (the run dir inside stays private).
    std::fs::set_permissions(fleet.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let private = fleet.mount(&format!("s3://{bucket}"), &[]);
    let shared = fleet.mount(&format!("s3://{bucket}"), &["--allow-other"]);
    let cat = |p: &Path| as_other_user(Path::new("/bin/cat")).arg(p).output().unwrap();
    let out = cat(&private.path("f"));
    assert!(!out.status.success(), "another user read a mount made without --allow-other");
    let out = cat(&shared.path("f"));
    assert!(out.status.success() && out.stdout == b"shared", "with --allow-other: {}", text(&out.stderr));
    let write = as_other_user(Path::new("/bin/sh"))
        .args(["-c", &format!("echo x > '{}'", shared.path("new").display())])
        .output()
        .unwrap();
    assert!(!write.status.success(), "another user wrote into a 0755 directory of the mounting user");
    assert_eq!(std::fs::read(shared.path("f")).unwrap(), b"shared", "the owner still reads it");
}
