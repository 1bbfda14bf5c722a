//! io_uring refused by the kernel, as under a container's seccomp profile: with the engine on `auto`
//! the proxies fall back to the pread engine, say why, and serve and cache as usual.
//!
//! `memarts start_proxy` runs with a seccomp filter installed in a `pre_exec` hook that makes the
//! three io_uring syscalls fail with EPERM; the proxies it spawns inherit the filter (filters survive
//! fork and exec), so the real kernel refuses their io_uring_setup.

use std::io;
use std::os::raw::c_ulong;
use std::os::unix::process::CommandExt;
use std::process::Output;

use memarts_proxy::chunk_store::{select_engine, EngineKind};

use crate::common::{moto, pattern, text, Fleet};

const CS: u64 = 64 << 10;

/// `AUDIT_ARCH_*` of `<linux/audit.h>` (not in the libc crate): the ELF machine number with the
/// 64-bit and little-endian flags. On x86_64 and aarch64 the io_uring syscalls are 425, 426, 427.
#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: Option<u32> = Some(0xC000_003E);
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: Option<u32> = Some(0xC000_00B7);
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
const AUDIT_ARCH: Option<u32> = None;

fn stmt(code: u32, k: u32) -> libc::sock_filter {
    libc::sock_filter { code: code as u16, jt: 0, jf: 0, k }
}

/// Jumps `jt` instructions ahead when the loaded word equals `k`, else `jf` ahead.
fn jump_eq(k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter { code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16, jt, jf, k }
}

/// A seccomp program: io_uring_setup, io_uring_enter and io_uring_register fail with EPERM (what
/// Docker's default profile does), everything else is allowed, and a syscall made through another
/// ABI than the native one kills the process (our binaries never make one).
fn deny_io_uring() -> [libc::sock_filter; 9] {
    let arch = AUDIT_ARCH.unwrap_or_else(|| {
        panic!("no seccomp audit arch known for {}: add its AUDIT_ARCH value", std::env::consts::ARCH)
    });
    let load = |offset: usize| stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, offset as u32);
    let ret = |action: u32| stmt(libc::BPF_RET | libc::BPF_K, action);
    let [setup, enter, register] =
        [libc::SYS_io_uring_setup, libc::SYS_io_uring_enter, libc::SYS_io_uring_register].map(|n| n as u32);
    [
        load(std::mem::offset_of!(libc::seccomp_data, arch)),
        jump_eq(arch, 1, 0),
        ret(libc::SECCOMP_RET_KILL_PROCESS),
        load(std::mem::offset_of!(libc::seccomp_data, nr)),
        jump_eq(setup, 3, 0),
        jump_eq(enter, 2, 0),
        jump_eq(register, 1, 0),
        ret(libc::SECCOMP_RET_ALLOW),
        ret(libc::SECCOMP_RET_ERRNO | (libc::EPERM as u32 & libc::SECCOMP_RET_DATA)),
    ]
}

/// Installs `filter` on the calling thread for good. Runs between fork and exec: two syscalls, no
/// allocation.
fn install(filter: &[libc::sock_filter]) -> io::Result<()> {
    let prog = libc::sock_fprog { len: filter.len() as u16, filter: filter.as_ptr().cast_mut() };
    // SAFETY: prctl with integer arguments only; no memory is passed.
    if unsafe {
        libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1 as c_ulong, 0 as c_ulong, 0 as c_ulong, 0 as c_ulong)
    } != 0
    {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `prog` points at `filter`, valid for the whole call; the kernel copies the program and
    // only reads it (the `*mut` is the C struct's type, nothing writes through it).
    if unsafe { libc::prctl(libc::PR_SET_SECCOMP, libc::SECCOMP_MODE_FILTER as c_ulong, &prog) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Runs `memarts <args>` for `fleet` under the io_uring-denying filter.
fn memarts_without_io_uring(fleet: &Fleet, args: &[&str]) -> Output {
    let filter = deny_io_uring();
    let mut cmd = fleet.command(args);
    // SAFETY: the hook runs in the forked child before exec and only calls `install`, which makes two
    // async-signal-safe prctl calls on a program built before the fork, and allocates nothing.
    unsafe {
        cmd.pre_exec(move || install(&filter));
    }
    cmd.output().expect("run memarts under the seccomp filter")
}

/// Without the filter this kernel gives us io_uring; otherwise the tests below would prove nothing.
fn assert_io_uring_works_unfiltered() {
    if let Err(e) = select_engine(EngineKind::IoUring) {
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
        let proc_status = std::fs::read_to_string(format!("/proc/{}/status", fleet.pid(slot))).unwrap();
        assert!(
            proc_status.lines().any(|l| l == "Seccomp:\t2"),
            "slot {slot} runs unfiltered:\n{proc_status}"
        );
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

    // The pread engine serves: byte-exact cold read, then a warm read entirely from the cache.
    let client = fleet.client(CS);
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
