//! io_uring refused by the kernel, as under a container's seccomp profile: with the I/O engine on `auto`
//! the proxies fall back to the pread engine, say why, and serve and cache as usual.
//!
//! `memarts start_proxy` runs under the filter of `common/seccomp.rs` (the three io_uring syscalls
//! fail with EPERM); the proxies it spawns inherit it, so the real kernel refuses their io_uring_setup.

use std::process::Output;

use memarts_proxy::chunk_store::{select_io_engine, IoEngineKind};

use crate::common::seccomp::{deny_io_uring_in, is_filtered};
use crate::common::{moto, pattern, text, Fleet};

const CS: u64 = 64 << 10;

/// Runs `memarts <args>` for `fleet` under the io_uring-denying filter.
fn memarts_without_io_uring(fleet: &Fleet, args: &[&str]) -> Output {
    deny_io_uring_in(&mut fleet.command(args)).output().expect("run memarts under the seccomp filter")
}

/// Without the filter this kernel gives us io_uring; otherwise the tests below would prove nothing.
fn assert_io_uring_works_unfiltered() {
    if let Err(e) = select_io_engine(IoEngineKind::IoUring) {
        panic!("io_uring is refused even without our filter ({e}); this test needs a kernel that allows it");
    }
}

#[test]
fn auto_falls_back_to_pread_when_seccomp_refuses_io_uring() {
    assert_io_uring_works_unfiltered();
    let bucket = moto().bucket("seccomp");
    let want = pattern(61, 6 * CS as usize + 7);
    moto().put(&bucket, "blob", &want);
    // `auto` even in the pass of the suite that forces pread through MEMARTS_IO_ENGINE.
    let fleet = Fleet::new(&[("MEMARTS_IO_ENGINE", "auto")]);
    let out = memarts_without_io_uring(&fleet, &["start_proxy", "2"]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "start_proxy under the filter failed:\n{stdout}{stderr}");
    assert!(stdout.contains("io engine pread"), "{stdout}");

    // The filter is on every proxy (inherited through start_proxy), and io_uring was refused with EPERM.
    let warning = "memarts: warning: using the pread engine: io_uring unavailable (Operation not permitted";
    assert_eq!(
        stderr.lines().filter(|l| l.starts_with(warning)).count(),
        2,
        "one warning per slot:\n{stderr}"
    );
    for slot in 0..2 {
        assert!(is_filtered(fleet.pid(slot)), "slot {slot} runs unfiltered");
        let log = std::fs::read_to_string(fleet.run_dir.join(format!("proxy-{slot}.log"))).unwrap();
        assert!(
            log.contains("io_uring unavailable (Operation not permitted")
                && log.contains("falling back to pread"),
            "slot {slot} did not log the fallback reason:\n{log}"
        );
    }
    let status = fleet.status();
    let slots = status["slots"].as_array().unwrap();
    assert_eq!(slots.len(), 2, "{status}");
    for s in slots {
        assert_eq!((s["alive"].as_bool(), s["io_engine"].as_str()), (Some(true), Some("pread")), "{s}");
    }

    // The pread engine serves: byte-exact cold read, then a warm read entirely from the cache (by
    // the slots, not straight from the files).
    let client = fleet.proxy_client(CS);
    let url = format!("s3://{bucket}/blob");
    assert_eq!(client.read(&url).unwrap(), want);
    let gets = moto().gets_settled(&bucket);
    assert_eq!(gets, 7, "one ranged GET per chunk on the cold read");
    fleet.wait_cached(7);
    let (hits, from_cache) = (fleet.total("hits"), fleet.total("bytes_from_cache"));
    assert_eq!(client.read(&url).unwrap(), want);
    assert_eq!(fleet.total("hits") - hits, 7, "every chunk of the second read is a hit");
    assert!(fleet.total("bytes_from_cache") - from_cache >= want.len() as u64);
    assert_eq!(moto().gets_settled(&bucket), gets, "the warm read reached the origin");
}

/// The control: under the same filter, insisting on io_uring fails, and says it was not permitted.
#[test]
fn io_uring_engine_under_the_same_filter_fails_with_eperm() {
    assert_io_uring_works_unfiltered();
    let fleet = Fleet::new(&[("MEMARTS_IO_ENGINE", "io_uring")]);
    let out = memarts_without_io_uring(&fleet, &["start_proxy", "1"]);
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "start_proxy succeeded with io_uring denied:\n{}", text(&out.stdout));
    assert!(
        stderr.contains("slot 0: I/O engine io_uring: io_uring engine unavailable: Operation not permitted"),
        "{stderr}"
    );
    assert_eq!(fleet.status()["running"], false, "a slot is left running");
}
