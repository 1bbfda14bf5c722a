//! `memarts-proxy`: one slot of a fleet. Started by `memarts start_proxy`, not by hand.
//!
//! It lives in this package, not in the proxy library's, so that the library needs neither `clap`
//! nor `tracing-subscriber`, and so that building the CLI always builds the binary it starts next to
//! it (`memarts start_proxy` looks for `memarts-proxy` beside its own executable).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

/// One memarts proxy slot. Started by `memarts start_proxy N`, which writes the fleet config and
/// waits for this process's readiness line on stdout.
#[derive(Parser, Debug)]
// Name and about spelled out: bare, they would be this package's (`memarts-ops`, the CLI's description).
#[command(
    name = "memarts-proxy",
    version,
    about = "The memarts proxy: serves chunks of origin objects from an SSD cache over a Unix socket."
)]
struct Args {
    /// The fleet config written by `memarts start_proxy` (`<run dir>/fleet.json`).
    #[arg(long)]
    fleet: PathBuf,
    /// This process's slot number, 0..slots.
    #[arg(long)]
    slot: u32,
}

/// glibc's malloc, told to keep what a slot frees. By default it returns freed memory at the top
/// of a heap to the kernel as soon as more than about twice the largest recent allocation is free
/// there, and serves allocations above a moving threshold (from 128 KiB) with `mmap`: a slot that
/// fetches objects of a few hundred KiB then faults in fresh zeroed pages for nearly every body it
/// assembles. Measured on a cold DataLoader epoch of 160 KiB objects (`cold_ab.py`, 8 runs each,
/// twice): the proxies' CPU per object 0.78 -> 0.73 ms and 1.06 -> 0.99 ms. Bodies up to 32 MiB
/// (glibc's own ceiling for the moving threshold) come from the heaps, and up to 64 MiB of freed
/// memory stays in each heap for the next ones. (mimalloc, tried instead: 1.21 ms, it purges
/// freed pages within milliseconds by default.)
fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: called first thing in `main`, before any other thread exists; `mallopt` only sets
    // allocator parameters and reports (ignored here) whether it took them.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 64 << 20);
    }
}

fn main() -> ExitCode {
    keep_freed_memory();
    let args = Args::parse();
    // Logs go to stderr, which `memarts start_proxy` points at `<run dir>/proxy-<slot>.log`;
    // stdout carries the readiness line only.
    // MEMARTS_LOG, through the settings table; a malformed environment is reported by the slot
    // itself (its readiness line), so logging falls back to `info` here.
    let filter =
        memarts_settings::Settings::from_env().ok().and_then(|s| s.log).unwrap_or_else(|| "info".into());
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_new(&filter).unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        // Colour codes only where a person watches: stderr is a log file under `start_proxy`.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    memarts_proxy::lifecycle::main(&args.fleet, args.slot)
}
