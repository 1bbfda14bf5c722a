//! The reliability campaign (`make reliability`; a short version runs in `make test`): every fault
//! class of docs/RELIABILITY.md injected into a real fleet — real proxy processes, real sockets, a real
//! S3-protocol server (moto) behind a fault-injecting relay — with clients that verify every byte
//! against the generator. Prints one row per fault class and fails if any promise broke.
//!
//! `RELIABILITY_SCALE=full` runs the whole campaign (≤ 15 minutes on 2 cores) and writes
//! `tests/reliability/results/latest.{json,md}`; the default, short, writes under the target dir.
//! `RELIABILITY_ONLY=<text>` runs the campaigns whose name contains the text.

#[path = "../e2e/common/mod.rs"]
#[allow(dead_code, unused_imports)]
mod common;

mod cluster;
mod disk;
mod origin;
mod protocol;
mod proxies;
mod report;
mod workload;

use std::path::PathBuf;
use std::time::Instant;

use report::Row;

/// How long and how hard each campaign runs.
#[derive(Debug, Clone, Copy)]
pub struct Scale {
    pub full: bool,
}

impl Scale {
    /// `short` in `make test`, `full` in `make reliability`.
    pub fn pick<T>(&self, short: T, full: T) -> T {
        if self.full {
            full
        } else {
            short
        }
    }
}

type Campaign = fn(Scale) -> Vec<Row>;

const CAMPAIGNS: &[(&str, Campaign)] = &[
    ("proxies", proxies::run),
    ("origin", origin::run),
    ("disk", disk::run),
    ("protocol", protocol::run),
    ("cluster", cluster::run),
];

/// Lets this process (and the proxies it starts) hold the campaign's many connections.
fn raise_open_files() {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit only read and write the struct we pass.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
            lim.rlim_cur = lim.rlim_max.min(1 << 16);
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

/// The coverage-guided fuzzing figures `ops/scripts/fuzz.sh` wrote (`make reliability` runs it first),
/// one row per target; a missing file is a broken promise of the full campaign.
fn fuzz_rows() -> Vec<Row> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("reliability/results/fuzz.json");
    let parsed = std::fs::read(&path)
        .map_err(|e| e.to_string())
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).map_err(|e| e.to_string()));
    let json = match parsed {
        Ok(j) => j,
        Err(e) => {
            let mut row = Row::new("protocol", "cargo-fuzz");
            row.violate(format!("no fuzzing figures in {}: {e} (run ops/scripts/fuzz.sh)", path.display()));
            return vec![row];
        }
    };
    let toolchain = json["toolchain"].as_str().unwrap_or("?").to_string();
    let targets = json["targets"].as_array().cloned().unwrap_or_default();
    targets
        .iter()
        .map(|t| {
            let name = t["target"].as_str().unwrap_or("?");
            let mut row =
                Row::new("protocol", &format!("cargo-fuzz `{name}` (coverage-guided decoder fuzzing)"));
            row.injected = t["executions"].as_u64().unwrap_or(0);
            let crashes = t["crashes"].as_u64().unwrap_or(0);
            row.detected = crashes;
            row.seconds = t["seconds"].as_f64().unwrap_or(0.0);
            if crashes > 0 {
                row.violate(format!("{crashes} crashes"));
            }
            row.note = format!("injected = fuzz inputs executed, detected = crashes ({toolchain})");
            row
        })
        .collect()
}

fn main() {
    let full = std::env::var("RELIABILITY_SCALE").is_ok_and(|s| s == "full");
    let scale = Scale { full };
    let only = std::env::var("RELIABILITY_ONLY").ok().filter(|s| !s.is_empty());
    raise_open_files();
    let started = Instant::now();
    let mut rows = Vec::new();
    for (name, campaign) in CAMPAIGNS {
        if only.as_deref().is_some_and(|o| !name.contains(o)) {
            continue;
        }
        eprintln!("reliability: {name} ({} scale)", if full { "full" } else { "short" });
        let t = Instant::now();
        match std::panic::catch_unwind(|| campaign(scale)) {
            Ok(r) => rows.extend(r),
            Err(p) => {
                let msg = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                let mut row = Row::new(name, "campaign");
                row.violate(format!("the campaign itself failed: {msg}"));
                rows.push(row);
            }
        }
        eprintln!("reliability: {name} done in {:.1}s", t.elapsed().as_secs_f64());
    }
    if full && only.is_none() {
        rows.extend(fuzz_rows());
    }
    for r in rows.iter_mut() {
        r.check_integrity();
    }
    let table = report::table(&rows);
    let notes = report::notes(&rows);
    println!("\n{table}\n{notes}");
    let broken: Vec<String> = rows
        .iter()
        .flat_map(|r| r.violations.iter().map(move |v| format!("{} / {}: {v}", r.class, r.fault)))
        .collect();
    let dir = if full {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("reliability/results")
    } else {
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("reliability")
    };
    std::fs::create_dir_all(&dir).expect("results dir");
    let json = serde_json::json!({
        "scale": if full { "full" } else { "short" },
        "seconds": started.elapsed().as_secs_f64(),
        "rows": rows,
        "violations": broken,
    });
    std::fs::write(dir.join("latest.json"), serde_json::to_vec_pretty(&json).unwrap()).expect("write json");
    let md = format!(
        "Reliability campaign ({} scale, {:.0} s, 2-core VM)\n\n{table}\n{notes}",
        if full { "full" } else { "short" },
        started.elapsed().as_secs_f64()
    );
    std::fs::write(dir.join("latest.md"), md).expect("write md");
    println!("results: {}", dir.join("latest.md").display());
    if !broken.is_empty() {
        eprintln!("\nreliability: {} broken promises:\n  {}", broken.len(), broken.join("\n  "));
        std::process::exit(1);
    }
}
