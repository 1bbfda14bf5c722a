//! A real FUSE mount for a test: `memarts mount` started in the background by the real CLI against
//! a test's fleet (or embedded), unmounted (and its process reaped) when the test ends. Needs
//! /dev/fuse (and fusermount3 when not root); a test fails loudly without them.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::fleet::{text, Fleet};

pub struct Mount {
    pub point: PathBuf,
    pub pid: i32,
    run_dir: PathBuf,
    env: Vec<(String, String)>,
}

impl Fleet {
    /// Mounts `url` on a new directory of this fleet's temp dir with `flags`.
    pub fn mount(&self, url: &str, flags: &[&str]) -> Mount {
        let point = self.dir.path().join(format!("mnt-{}", next()));
        std::fs::create_dir(&point).unwrap();
        let mut args = vec!["mount", url, point.to_str().unwrap()];
        args.extend_from_slice(flags);
        let out = self.memarts(&args);
        assert!(
            out.status.success(),
            "memarts mount {url} failed (is /dev/fuse usable?):\n{}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
        let said = text(&out.stdout);
        let pid = said
            .split("(pid ")
            .nth(1)
            .and_then(|s| s.split(',').next())
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no pid in {said:?}"));
        Mount { point, pid, run_dir: self.run_dir.clone(), env: self.extra_env.clone() }
    }
}

fn next() -> u32 {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Whether something is mounted exactly at `path` (from /proc/self/mountinfo).
pub fn is_mounted(path: &Path) -> bool {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let want = path.to_str().unwrap();
    info.lines().any(|l| l.split(' ').nth(4) == Some(want))
}

pub fn alive(pid: i32) -> bool {
    // A zombie has been reaped by nobody yet but serves nothing.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| s.rsplit_once(')').is_some_and(|(_, r)| !r.trim_start().starts_with('Z')))
}

impl Mount {
    pub fn path(&self, rel: &str) -> PathBuf {
        self.point.join(rel)
    }

    /// `memarts unmount` of this mount.
    pub fn unmount(&self, extra: &[&str]) -> std::process::Output {
        let mut cmd = std::process::Command::new(super::fleet::memarts_bin());
        cmd.arg("unmount").args(extra).arg(&self.point).env("MEMARTS_RUN_DIR", &self.run_dir);
        cmd.envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        cmd.output().expect("run memarts unmount")
    }

    /// Waits until the mount process has exited.
    pub fn wait_exit(&self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while alive(self.pid) {
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        true
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if is_mounted(&self.point) {
            let _ = self.unmount(&["--lazy"]);
        }
        if !self.wait_exit(Duration::from_secs(10)) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}
