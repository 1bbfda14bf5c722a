//! A real fleet for a test: `memarts start_proxy` in a private run dir and cache dir, proxies as real
//! processes, stopped (and checked) when the test ends.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use memarts_shim::{Client, ShimConfig};

use super::moto::{moto, target_dir};

pub struct Fleet {
    pub dir: tempfile::TempDir,
    pub run_dir: PathBuf,
    pub cache_dir: PathBuf,
    pub extra_env: Vec<(String, String)>,
}

pub fn memarts_bin() -> PathBuf {
    let p = target_dir().join("memarts");
    assert!(p.exists(), "{} is missing: build the binaries first (`cargo build --bins`)", p.display());
    p
}

impl Fleet {
    /// A fleet of `n` slots reaching the shared moto server, with `env` on top.
    pub fn start(n: u32, env: &[(&str, &str)]) -> Fleet {
        let fleet = Fleet::new(env);
        fleet.start_proxy(n);
        fleet
    }

    /// Private dirs and environment for a fleet, with no proxy started yet (for tests that start it
    /// their own way, through [`Fleet::command`]).
    pub fn new(env: &[(&str, &str)]) -> Fleet {
        let dir = tempfile::tempdir().expect("tempdir");
        Fleet {
            run_dir: dir.path().join("run"),
            cache_dir: dir.path().join("cache"),
            extra_env: env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            dir,
        }
    }

    /// A `memarts` subcommand with this fleet's dirs and environment, not yet run.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(memarts_bin());
        cmd.args(args)
            .env("MEMARTS_RUN_DIR", &self.run_dir)
            .env("MEMARTS_CACHE_DIR", &self.cache_dir)
            .env("MEMARTS_LOG", "info,memarts_proxy=debug")
            .envs(moto().env())
            .envs(self.extra_env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        cmd
    }

    /// Runs a `memarts` subcommand with this fleet's dirs and environment.
    pub fn memarts(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("run memarts")
    }

    pub fn start_proxy(&self, n: u32) {
        let out = self.memarts(&["start_proxy", &n.to_string()]);
        assert!(out.status.success(), "start_proxy {n} failed:\n{}{}", text(&out.stdout), text(&out.stderr));
    }

    pub fn stop_proxy(&self) -> Output {
        let out = self.memarts(&["stop_proxy", "--grace", "10"]);
        assert!(out.status.success(), "stop_proxy failed:\n{}{}", text(&out.stdout), text(&out.stderr));
        out
    }

    /// The recovery script of `ops/scripts/`: stop, then start with the same N and options.
    pub fn recover(&self, n: u32) {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ops/scripts/memarts-recover.sh");
        let out = Command::new("bash")
            .arg(&script)
            .arg(n.to_string())
            .env("MEMARTS_BIN", memarts_bin())
            .env("MEMARTS_RUN_DIR", &self.run_dir)
            .env("MEMARTS_CACHE_DIR", &self.cache_dir)
            .envs(moto().env())
            .envs(self.extra_env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .output()
            .expect("run recovery script");
        if !out.status.success() {
            panic!("recovery failed:\n{}{}{}", text(&out.stdout), text(&out.stderr), self.slot_logs());
        }
    }

    /// The last lines of every slot's log, to say why a start failed.
    pub fn slot_logs(&self) -> String {
        let mut out = String::new();
        let Ok(entries) = std::fs::read_dir(&self.run_dir) else { return out };
        let mut logs: Vec<_> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "log"))
            .collect();
        logs.sort();
        for log in logs {
            let body = std::fs::read_to_string(&log).unwrap_or_default();
            let tail: Vec<&str> = body.lines().rev().take(15).collect();
            out.push_str(&format!("--- {} (last lines)\n", log.display()));
            for line in tail.into_iter().rev() {
                out.push_str(line);
                out.push('\n');
            }
        }
        out
    }

    pub fn client(&self, chunk_size: u64) -> Client {
        Client::new(ShimConfig {
            run_dir: self.run_dir.clone(),
            chunk_size,
            parallel: 8,
            deadline: Duration::from_secs(30),
            ..ShimConfig::default()
        })
        .expect("client")
    }

    /// A client that reads through the proxies only (no local reads of chunk files): for tests of
    /// what the proxies do.
    pub fn proxy_client(&self, chunk_size: u64) -> Client {
        Client::new(ShimConfig { local_reads: false, ..self.client(chunk_size).config().clone() })
            .expect("client")
    }

    pub fn status(&self) -> serde_json::Value {
        let out = self.memarts(&["status", "--json"]);
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("status --json: {e}: {}", text(&out.stdout)))
    }

    /// Sum of a numeric field over all slots of `status --json`.
    pub fn total(&self, field: &str) -> u64 {
        self.status()["slots"].as_array().unwrap().iter().filter_map(|s| s[field].as_u64()).sum()
    }

    /// Sum over all slots of the counter or gauge `name` of their metrics (`Request::Metrics`, as
    /// the Prometheus endpoint shows them, without `memarts_` and `_total`).
    pub fn metric_total(&self, name: &str) -> f64 {
        let slots = self.status()["slots"].as_array().unwrap().len();
        let mut sum = 0.0;
        for slot in 0..slots {
            let mut s = super::raw::welcomed(&self.run_dir.join(format!("proxy-{slot}.sock")));
            let Some(memarts_protocol::Response::Metrics(m)) =
                super::raw::call(&mut s, &memarts_protocol::Request::Metrics)
            else {
                panic!("slot {slot} sent no metrics");
            };
            for family in m.families.iter().filter(|f| f.name == name) {
                for point in &family.points {
                    if let memarts_protocol::MetricValue::Number(n) = point.value {
                        sum += n;
                    }
                }
            }
        }
        sum
    }

    /// Waits until every slot has rebuilt its chunk index. Until then a slot cannot tell a cold
    /// object from one it lost the metadata of, so a first read revalidates with a HEAD: a test
    /// that counts HEADs of cold reads waits for this first (on a loaded machine the rebuild can
    /// end after a test's first read).
    pub fn wait_index_ready(&self) {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let status = self.status();
            let slots = status["slots"].as_array().cloned().unwrap_or_default();
            if !slots.is_empty() && slots.iter().all(|s| s["index_ready"].as_bool() == Some(true)) {
                return;
            }
            assert!(std::time::Instant::now() < deadline, "the slots never rebuilt their index: {status}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until the fleet has `n` chunks on disk, as files or packed records (fills are written
    /// after the reply is sent).
    pub fn wait_cached(&self, n: u64) {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        // The index counts a chunk once room is reserved for it, before its file is renamed into
        // place: a test that kills the fleet next needs the files, so both are waited for.
        // Small chunks are packed into segments: those count once the packed table names them
        // (after their record is written).
        let packed = || -> u64 {
            let tables = std::fs::read_dir(&self.run_dir).into_iter().flatten().flatten();
            tables
                .filter(|e| {
                    e.file_name().to_str().is_some_and(|n| n.starts_with("packed-") && n.ends_with(".table"))
                })
                .filter_map(|e| memarts_disk::packed_table::PackedFile::open(&e.path()).ok())
                .map(|f| f.table().entries().len() as u64)
                .sum()
        };
        let on_disk = || super::files::files_below(&self.cache_dir.join("v1/chunks")).len() as u64 + packed();
        while self.total("cached_chunks") < n || on_disk() < n {
            assert!(std::time::Instant::now() < deadline, "the fleet never cached {n} chunks");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn pid(&self, slot: u32) -> i32 {
        let text = std::fs::read_to_string(self.run_dir.join(format!("proxy-{slot}.pid"))).expect("pid file");
        text.trim().parse().expect("pid")
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        // A test that failed may leave a slot stopped (SIGSTOP) or hung: stopped slots are woken
        // so the stop reaches them, and any slot still alive after it is killed, so no fleet
        // outlives its test.
        let pids: Vec<i32> = std::fs::read_dir(&self.run_dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| {
                e.file_name().to_str().is_some_and(|n| n.starts_with("proxy-") && n.ends_with(".pid"))
            })
            .filter_map(|e| std::fs::read_to_string(e.path()).ok()?.trim().parse().ok())
            .collect();
        for &pid in &pids {
            // SAFETY: kill(2) with a pid and a signal number; no memory is shared.
            unsafe { libc::kill(pid, libc::SIGCONT) };
        }
        let _ = self.memarts(&["stop_proxy", "--grace", "5"]);
        let run_dir = self.run_dir.to_string_lossy().into_owned();
        for pid in pids {
            // Still this fleet's slot (its command line names the run dir), not a pid reused.
            let ours = std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(run_dir.as_str()));
            if ours {
                // SAFETY: as above.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
}

/// The origin GETs of the same bytes asked more than once, from the slots' origin logs of every
/// `(label, run dir)` (`<label>/<slot>: <log line>`): what a test that counts GETs shows when it fails.
pub fn repeated_gets(run_dirs: &[(String, std::path::PathBuf)], slots: u32) -> Vec<String> {
    let mut by_target: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for (label, run_dir) in run_dirs {
        for slot in 0..slots {
            let log = std::fs::read_to_string(run_dir.join(format!("origin-{slot}.log"))).unwrap_or_default();
            for line in log.lines().filter(|l| l.contains(" GET ")) {
                // "<time> GET <url> bytes=<a>-<b> [if-match=..] attempt=.."
                let mut words = line.split(' ').skip(2);
                let target = format!("{} {}", words.next().unwrap_or(""), words.next().unwrap_or(""));
                by_target.entry(target).or_default().push(format!("{label}/{slot}: {line}"));
            }
        }
    }
    by_target.into_values().filter(|lines| lines.len() > 1).flatten().collect()
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Deterministic pseudo-random bytes for (seed, len): every test verifies against these.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}
