//! `memarts`: the command line of a memarts node — fleet lifecycle and data commands.

mod access;
mod cli;
mod cluster;
mod data;
mod fleet;
mod mount;
mod settings;
mod slots;
mod status;
mod supervise;
mod transfer;
mod warmup;

fn main() -> std::process::ExitCode {
    cli::main()
}
