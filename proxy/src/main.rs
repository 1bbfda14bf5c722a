//! `memarts-proxy`: one slot of a fleet. Started by `memarts start_proxy`, not by hand.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

/// One memarts proxy slot. Started by `memarts start_proxy N`, which writes the fleet config and
/// waits for this process's readiness line on stdout.
#[derive(Parser, Debug)]
#[command(version, about)]
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
    memarts_proxy::lifecycle::main(&args.fleet, args.slot)
}
