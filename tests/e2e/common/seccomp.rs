//! A seccomp filter that refuses io_uring, as a container's default profile does: installed in a
//! `pre_exec` hook of a command, it makes io_uring_setup, io_uring_enter and io_uring_register fail
//! with EPERM in that process and everything it spawns (filters survive fork and exec), so the real
//! kernel refuses the proxies' io_uring.

use std::io;
use std::os::raw::c_ulong;
use std::os::unix::process::CommandExt;
use std::process::Command;

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

/// Makes `cmd` (and whatever it spawns) run under the io_uring-denying filter.
pub fn deny_io_uring_in(cmd: &mut Command) -> &mut Command {
    let filter = deny_io_uring();
    // SAFETY: the hook runs in the forked child before exec and only calls `install`, which makes two
    // async-signal-safe prctl calls on a program built before the fork, and allocates nothing.
    unsafe { cmd.pre_exec(move || install(&filter)) }
}

/// Whether the process `pid` runs under a seccomp filter (`Seccomp: 2` in `/proc/<pid>/status`).
pub fn is_filtered(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .is_ok_and(|s| s.lines().any(|l| l == "Seccomp:\t2"))
}
