//! Disk faults: damaged and foreign files in the cache dir (`damage.rs`), the cache on a full
//! filesystem (`full.rs`) and io_uring refused by seccomp (`seccomp.rs`). This file holds what they
//! share: walks of the cache dir and whole-dataset reads.

mod damage;
mod full;
mod seccomp;

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use memarts_shim::Client;

use crate::report::Row;
use crate::workload::{Dataset, Tally};
use crate::Scale;

/// Chunks at most this large are read and checked by the proxy and sent inline.
const SMALL: u64 = 64 << 10;
/// Larger chunks are passed by descriptor and checked by the shim.
const LARGE: u64 = 256 << 10;

pub fn run(scale: Scale) -> Vec<Row> {
    vec![damage::run(scale), full::run(scale), seccomp::run(scale)]
}

/// Every regular file under `dir`, sorted (none if `dir` does not exist).
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut files = crate::common::files::files_below(dir);
    files.retain(|f| std::fs::symlink_metadata(f).is_ok_and(|m| m.is_file()));
    files
}

/// Bytes allocated to the files under `dir` (`st_blocks * 512`), as `du` counts them; files that
/// vanish during the walk count for nothing.
fn bytes_on_disk(dir: &Path) -> u64 {
    files_under(dir).iter().filter_map(|f| std::fs::symlink_metadata(f).ok()).map(|m| m.blocks() * 512).sum()
}

/// Reads every object of `data` whole through `client`, checking every byte.
fn read_all(client: &Client, data: &Dataset, tally: &Tally) {
    for (i, (_, want)) in data.objects.iter().enumerate() {
        let url = data.url(i);
        match client.read(&url) {
            Ok(got) => tally.check(&got, want),
            Err(e) => tally.fail(format!("read {url}: {e}")),
        }
    }
}

/// Lines of the slots' logs (`<run dir>/proxy-<slot>.log`) that contain `needle`.
fn log_lines(run_dir: &Path, slots: u32, needle: &str) -> Vec<String> {
    (0..slots)
        .flat_map(|s| {
            let log = std::fs::read_to_string(run_dir.join(format!("proxy-{s}.log"))).unwrap_or_default();
            log.lines().filter(|l| l.contains(needle)).map(str::to_string).collect::<Vec<_>>()
        })
        .collect()
}

/// Flips one byte of the chunk file `path` in place, in its data (past the header, whose padding is
/// not checked); `Ok(false)` when the file has no data left to damage.
fn flip_data_byte(path: &Path, pick: impl FnOnce(u64, u64) -> u64) -> io::Result<bool> {
    use std::os::unix::fs::FileExt;
    let file = std::fs::OpenOptions::new().read(true).write(true).open(path)?;
    let len = file.metadata()?.len();
    let mut head = [0u8; 16];
    if len < 16 {
        return Ok(false);
    }
    file.read_exact_at(&mut head, 0)?;
    let data_offset = u64::from(u32::from_le_bytes([head[12], head[13], head[14], head[15]]));
    if data_offset >= len {
        return Ok(false);
    }
    let at = pick(data_offset, len);
    let mut byte = [0u8; 1];
    file.read_exact_at(&mut byte, at)?;
    file.write_all_at(&[byte[0] ^ 0x5a], at)?;
    Ok(true)
}
