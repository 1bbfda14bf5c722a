//! Installing (issue 16): `make install-bin` (the binary half of `make install`) puts `memarts` and
//! `memarts-proxy` into PREFIX/bin, and the installed `memarts` starts a fleet with neither on PATH
//! (it finds `memarts-proxy` next to itself). A `memarts` copied alone, with no `memarts-proxy` next
//! to it, on PATH or in `MEMARTS_PROXY_BIN`, fails before it makes anything on disk, with an error
//! that says where it looked and what to do; one on PATH is found.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::common::{moto, moto::target_dir, text, Fleet};

/// PATH with the system's directories only: no memarts binary on it.
const SYSTEM_PATH: &str = "/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin";

/// `exe args` with the fleet's dirs and origin, PATH `path`, and no MEMARTS_PROXY_BIN unless given.
fn run(fleet: &Fleet, exe: &Path, args: &[&str], path: &str, proxy_bin: Option<&Path>) -> Output {
    let mut cmd = Command::new(exe);
    cmd.args(args)
        .env("MEMARTS_RUN_DIR", &fleet.run_dir)
        .env("MEMARTS_CACHE_DIR", &fleet.cache_dir)
        .env("PATH", path)
        .env_remove("MEMARTS_PROXY_BIN")
        .envs(moto().env());
    if let Some(p) = proxy_bin {
        cmd.env("MEMARTS_PROXY_BIN", p);
    }
    cmd.output().expect("run memarts")
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("repository root").to_path_buf()
}

#[test]
fn make_install_bin_puts_both_binaries_in_prefix_and_the_installed_memarts_finds_its_proxy() {
    let prefix = tempfile::tempdir().unwrap();
    let out = Command::new("make")
        .arg("-C")
        .arg(repo_root())
        .arg("install-bin")
        .arg(format!("BIN_DIR={}", target_dir().display()))
        .arg(format!("PREFIX={}", prefix.path().display()))
        .output()
        .expect("run make");
    assert!(out.status.success(), "make install-bin failed:\n{}{}", text(&out.stdout), text(&out.stderr));
    for name in ["memarts", "memarts-proxy", "memarts-recover"] {
        let meta = std::fs::metadata(prefix.path().join("bin").join(name)).unwrap();
        assert!(meta.is_file() && meta.permissions().mode() & 0o111 != 0, "{name} is not an executable");
    }
    assert!(text(&out.stdout).contains("is not on PATH"), "no hint about PATH: {}", text(&out.stdout));

    let fleet = Fleet::new(&[]);
    let memarts = prefix.path().join("bin/memarts");
    let started = run(&fleet, &memarts, &["start_proxy", "1"], SYSTEM_PATH, None);
    assert!(
        started.status.success(),
        "installed memarts did not start:\n{}{}",
        text(&started.stdout),
        text(&started.stderr)
    );
    let status = run(&fleet, &memarts, &["status"], SYSTEM_PATH, None);
    assert!(status.status.success(), "status:\n{}{}", text(&status.stdout), text(&status.stderr));
    let stopped = run(&fleet, &memarts, &["stop_proxy"], SYSTEM_PATH, None);
    assert!(stopped.status.success(), "stop_proxy:\n{}{}", text(&stopped.stdout), text(&stopped.stderr));
}

#[test]
fn memarts_alone_says_where_it_looked_for_its_proxy_and_leaves_nothing_behind() {
    let alone = tempfile::tempdir().unwrap();
    let memarts = alone.path().join("memarts");
    std::fs::copy(target_dir().join("memarts"), &memarts).unwrap();
    let fleet = Fleet::new(&[]);

    let out = run(&fleet, &memarts, &["start_proxy", "1"], SYSTEM_PATH, None);
    let err = text(&out.stderr);
    assert!(!out.status.success(), "started with no memarts-proxy anywhere: {err}");
    for needle in [
        "cannot find memarts-proxy",
        &alone.path().join("memarts-proxy").display().to_string(),
        SYSTEM_PATH,
        "MEMARTS_PROXY_BIN",
        "make install",
    ] {
        assert!(err.contains(needle), "the error does not say {needle:?}: {err}");
    }
    assert!(!err.contains("No such file or directory"), "a raw OS error instead of an explanation: {err}");
    assert!(!fleet.run_dir.exists(), "a run dir was left behind: {}", fleet.run_dir.display());

    // MEMARTS_PROXY_BIN naming something that cannot run: said so, nothing made either.
    let not_exec = alone.path().join("not-a-proxy");
    std::fs::write(&not_exec, "plain text").unwrap();
    let out = run(&fleet, &memarts, &["start_proxy", "1"], SYSTEM_PATH, Some(&not_exec));
    let err = text(&out.stderr);
    assert!(
        !out.status.success() && err.contains("MEMARTS_PROXY_BIN") && err.contains("not-a-proxy"),
        "{err}"
    );
    assert!(!fleet.run_dir.exists(), "a run dir was left behind");

    // memarts-proxy on PATH: found there.
    let on_path = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(target_dir().join("memarts-proxy"), on_path.path().join("memarts-proxy"))
        .unwrap();
    let path = format!("{}:{SYSTEM_PATH}", on_path.path().display());
    let out = run(&fleet, &memarts, &["start_proxy", "1"], &path, None);
    assert!(
        out.status.success(),
        "memarts-proxy on PATH was not found:\n{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let out = run(&fleet, &memarts, &["stop_proxy"], &path, None);
    assert!(out.status.success(), "stop_proxy:\n{}{}", text(&out.stdout), text(&out.stderr));
}
