//! io_uring refused by the kernel: the fleet starts under a seccomp filter that makes the io_uring
//! syscalls fail with EPERM (as a container's default profile does), with the I/O engine on `auto`. Every
//! slot must fall back to the pread engine and serve readers byte-exact.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use memarts_proxy::chunk_store::{select_io_engine, IoEngineKind};

use super::{LARGE, SMALL};
use crate::common::seccomp::{deny_io_uring_in, is_filtered};
use crate::common::{text, Fleet};
use crate::report::Row;
use crate::workload::{readers, stop_readers, Dataset, Tally};
use crate::Scale;

const SLOTS: u32 = 4;

pub fn run(scale: Scale) -> Row {
    let mut row = Row::new("disk", "io_uring refused (seccomp)");
    let started = Instant::now();
    // Without the filter this kernel must give us io_uring, or the row would prove nothing.
    if let Err(e) = select_io_engine(IoEngineKind::IoUring) {
        row.violate(format!(
            "io_uring is refused even without the filter ({e}): this fault cannot be injected"
        ));
        return row;
    }
    let data = Arc::new(Dataset::put("seccomp", scale.pick(16, 48), 1 << 20, 31));
    // `auto` even when the environment forces an I/O engine (make test's pread pass).
    let fleet = Fleet::new(&[("MEMARTS_IO_ENGINE", "auto")]);
    let out = deny_io_uring_in(&mut fleet.command(&["start_proxy", &SLOTS.to_string()]))
        .output()
        .expect("run memarts start_proxy");
    if !out.status.success() {
        row.violate(format!(
            "start_proxy under the seccomp filter failed: {}{}",
            text(&out.stdout),
            text(&out.stderr)
        ));
        return row;
    }
    // Injected: slots running under the filter whose io_uring the kernel refused, as their logs say.
    for slot in 0..SLOTS {
        let log =
            std::fs::read_to_string(fleet.run_dir.join(format!("proxy-{slot}.log"))).unwrap_or_default();
        let refused = log.contains("io_uring unavailable (Operation not permitted");
        if is_filtered(fleet.pid(slot)) && refused && log.contains("falling back to pread") {
            row.injected += 1;
        } else {
            row.violate(format!("slot {slot} did not run under the filter, or did not log the refusal"));
        }
    }

    let stop = Arc::new(AtomicBool::new(false));
    let (small, h1) = readers(&fleet, &data, 4, SMALL, &stop);
    let (large, h2) = readers(&fleet, &data, 4, LARGE, &stop);
    std::thread::sleep(Duration::from_secs(scale.pick(3, 10)));
    stop_readers(&stop, h1);
    stop_readers(&stop, h2);
    small.add_to(&mut row);
    large.add_to(&mut row);

    // Detected: slots that are alive and report the pread engine.
    let status = fleet.status();
    let slots = status["slots"].as_array().cloned().unwrap_or_default();
    row.detected = (slots.iter()).filter(|s| s["alive"] == true && s["io_engine"] == "pread").count() as u64;
    if row.detected != u64::from(SLOTS) {
        row.violate(format!("{} of {SLOTS} slots alive on the pread engine: {status}", row.detected));
    }
    let hits = fleet.total("hits");
    if hits == 0 {
        row.violate("no chunk was served from the cache by the pread engine");
    }
    row.note = format!(
        "injected = slots started under a seccomp filter that refuses io_uring_setup/enter/register \
         with EPERM (checked in /proc/<pid>/status and the slot's log), detected = slots alive that \
         report the pread engine in `memarts status`; {} reads verified, {hits} chunk hits served by pread",
        Tally::get(&small.calls) + Tally::get(&large.calls)
    );
    row.seconds = started.elapsed().as_secs_f64();
    row
}
