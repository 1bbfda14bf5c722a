//! A fleet of another user, the impostor of the trust tests: `memarts start_proxy` run as uid 65534
//! (`setpriv`) in a run dir that user created, letting root in (`allowed_uids = [0]`) with its run
//! dir and sockets opened to everyone, as an attacker on a shared node would. Its binaries are links
//! in a directory the other user can reach (the workspace may sit under a private directory), and
//! it is stopped by its owner when dropped.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use super::moto::target_dir;
use super::raw::OTHER_UID;
use super::text;

pub struct ForeignFleet {
    /// 0755, owned by root: `bin/` (the binaries) and `home/` (the other user's, 0755).
    pub base: tempfile::TempDir,
    pub run_dir: PathBuf,
    env: Vec<(String, String)>,
}

/// `memarts` and `memarts-proxy` in `<dir>/bin`, which every user can reach and run.
pub fn binaries_for_everyone(dir: &Path) -> PathBuf {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    for name in ["memarts", "memarts-proxy"] {
        let src = target_dir().join(name);
        assert!(
            src.exists(),
            "{} is missing: build the binaries first (`cargo build --bins`)",
            src.display()
        );
        let dst = bin.join(name);
        if std::fs::hard_link(&src, &dst).is_err() {
            std::fs::copy(&src, &dst).unwrap();
        }
    }
    bin
}

/// `command` run as uid/gid 65534 with no supplementary groups.
pub fn as_other_user(command: &Path) -> Command {
    assert!(
        nix::unistd::geteuid().is_root(),
        "acting as another user (setpriv to uid {OTHER_UID}) needs root; CI runs the tests as root"
    );
    let mut cmd = Command::new("setpriv");
    cmd.args([&format!("--reuid={OTHER_UID}"), &format!("--regid={OTHER_UID}"), "--clear-groups"]);
    cmd.arg(command);
    cmd
}

impl ForeignFleet {
    /// Starts `slots` slots as uid 65534 in `<home>/run`, reaching the origin with `origin_env`
    /// (`AWS_*`).
    pub fn start(slots: u32, origin_env: &[(String, String)]) -> ForeignFleet {
        let base = tempfile::tempdir().unwrap();
        std::fs::set_permissions(base.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        binaries_for_everyone(base.path());
        let home = base.path().join("home");
        std::fs::create_dir(&home).unwrap();
        std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o755)).unwrap();
        let id = nix::unistd::Uid::from_raw(OTHER_UID);
        nix::unistd::chown(&home, Some(id), Some(nix::unistd::Gid::from_raw(OTHER_UID))).unwrap();
        let config = home.join("fleet.toml");
        std::fs::write(&config, "allowed_uids = [0]\n").unwrap();
        let run_dir = home.join("run");
        let mut env: Vec<(String, String)> = origin_env.to_vec();
        for (k, v) in [
            ("MEMARTS_RUN_DIR", run_dir.display().to_string()),
            ("MEMARTS_CACHE_DIR", home.join("cache").display().to_string()),
            ("MEMARTS_CONFIG", config.display().to_string()),
            ("HOME", home.display().to_string()),
        ] {
            env.push((k.to_string(), v));
        }
        let fleet = ForeignFleet { base, run_dir, env };
        let out = fleet.memarts(&["start_proxy", &slots.to_string()]);
        assert!(
            out.status.success(),
            "start_proxy as uid {OTHER_UID}: {}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
        // What the impostor does next: let everyone in.
        std::fs::set_permissions(&fleet.run_dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        for slot in 0..slots {
            let sock = fleet.run_dir.join(format!("proxy-{slot}.sock"));
            std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o666)).unwrap();
        }
        fleet
    }

    /// Runs `memarts args` as the fleet's owner, with its environment.
    pub fn memarts(&self, args: &[&str]) -> Output {
        as_other_user(&self.base.path().join("bin/memarts"))
            .args(args)
            .env_remove("XDG_RUNTIME_DIR")
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .output()
            .expect("run setpriv memarts")
    }

    /// Requests the fleet's slots have served, summed (as its owner sees them).
    pub fn requests(&self) -> u64 {
        let out = self.memarts(&["status", "--json"]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!("status --json as the owner: {e}: {}{}", text(&out.stdout), text(&out.stderr))
        });
        v["slots"].as_array().expect("slots").iter().map(|s| s["requests"].as_u64().expect("requests")).sum()
    }
}

impl Drop for ForeignFleet {
    fn drop(&mut self) {
        let _ = self.memarts(&["stop_proxy", "--grace", "5"]);
    }
}
