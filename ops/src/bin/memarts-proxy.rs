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

/// The slot's allocator: jemalloc. A slot holds tables that grow with what it caches (the chunk
/// index, the metadata cache) beside the bodies of a few hundred KiB it assembles for every fetch.
/// glibc's malloc had to be told to keep freed memory (a 32 MiB mmap threshold, a 64 MiB trim
/// threshold) so that those bodies did not fault in fresh zeroed pages each time (9.5% of a
/// cold epoch's proxy CPU), and then held ~75% more than the slot's live data, stranded between
/// the old and new places of its growing tables. Measured on this VM: 1,000,000 objects of 4 KiB
/// cached by 2 slots, 295 -> 165 B of proxy memory per object; a cold DataLoader epoch
/// (`cold_ab.py --scenario loader`, 6 runs each), proxies' CPU 0.663 ms per object either way.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
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
