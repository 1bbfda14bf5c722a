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
