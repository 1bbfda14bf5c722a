//! S5: a client uses a fleet only if its run dir and its proxies belong to the client's uid, or to a
//! uid it trusts explicitly (`MEMARTS_TRUSTED_UIDS`). The impostor is a real fleet of uid 65534
//! (`setpriv`) that lets root in and serves other bytes under the victim's object names; the
//! victim's Rust shim and CLI are refused with a typed error before a request reaches it. Also:
//! `stop_proxy` never signals the pids of another user's run dir, and a client of an allowed uid
//! reads local paths through the proxy only under `local_roots`.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use memarts_shim::{Client, Error, ShimConfig};

use crate::common::fault_relay::FaultRelay;
use crate::common::fleet::memarts_bin;
use crate::common::foreign::{as_other_user, binaries_for_everyone, ForeignFleet};
use crate::common::raw::OTHER_UID;
use crate::common::{moto, pattern, text, Fleet};

/// The victim's object, and the impostor's bytes under the same name.
struct Objects {
    bucket: String,
    url: String,
    genuine: Vec<u8>,
    poisoned: Vec<u8>,
}

fn objects() -> (Objects, FaultRelay) {
    let m = moto();
    let bucket = m.bucket("victim");
    let poison = m.bucket("poison");
    let genuine = [b"genuine ".as_slice(), &pattern(1, 3 << 20)].concat();
    let poisoned = [b"poisoned".as_slice(), &pattern(2, 3 << 20)].concat();
    m.put(&bucket, "train/data.bin", &genuine);
    m.put(&poison, "train/data.bin", &poisoned);
    // The impostor's origin: the victim's bucket names, the poison bucket's bytes.
    let relay = FaultRelay::start(&m.endpoint);
    relay.rewrite(&bucket, &poison);
    let url = format!("s3://{bucket}/train/data.bin");
    (Objects { bucket, url, genuine, poisoned }, relay)
}

fn shim(run_dir: &Path, trusted_uids: Vec<u32>) -> Result<Client, Error> {
    Client::new(ShimConfig {
        run_dir: run_dir.to_path_buf(),
        deadline: Duration::from_secs(10),
        trusted_uids,
        ..ShimConfig::default()
    })
}

/// `memarts args` as root against the fleet in `run_dir`, with `env` on top.
fn cli(run_dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(memarts_bin())
        .args(args)
        .env("MEMARTS_RUN_DIR", run_dir)
        .env_remove("MEMARTS_TRUSTED_UIDS")
        .envs(moto().env())
        .envs(env.iter().copied())
        .output()
        .expect("run memarts")
}

fn assert_refused(out: &Output, what: &str, parts: &[&str]) {
    let err = text(&out.stderr);
    assert!(!out.status.success(), "{what} succeeded against an untrusted fleet: {}", text(&out.stdout));
    assert!(out.stdout.is_empty(), "{what} printed bytes from an untrusted fleet");
    for part in parts {
        assert!(err.contains(part), "{what}: {part:?} missing from: {err}");
    }
}

#[test]
fn a_fleet_of_another_user_is_refused_by_the_shim_and_the_cli_before_it_sees_a_request() {
    let (obj, relay) = objects();
    let impostor = ForeignFleet::start(1, &relay.env());
    let run = impostor.run_dir.display().to_string();
    let before = impostor.requests();

    // The Rust shim: a typed error naming the run dir, its owner and the fix.
    let err = shim(&impostor.run_dir, vec![]).err().expect("an impostor's fleet was accepted");
    assert!(matches!(err, Error::Untrusted(_)), "{err}");
    let msg = err.to_string();
    for part in [run.as_str(), "uid 65534", "MEMARTS_TRUSTED_UIDS=65534", "MEMARTS_RUN_DIR"] {
        assert!(msg.contains(part), "{part:?} missing from: {msg}");
    }

    // The CLI: reads, writes (uploads and memarts-only objects) and status, all refused.
    let local = impostor.base.path().join("upload.bin");
    std::fs::write(&local, b"the job's checkpoint").unwrap();
    let local = local.display().to_string();
    let put_url = format!("s3://{}/ckpt/step-1.bin", obj.bucket);
    for args in [
        vec!["cat", obj.url.as_str()],
        vec!["stat", obj.url.as_str()],
        vec!["ls", "-r", &obj.url[..obj.url.len() - "data.bin".len()]],
        vec!["cp", &local, &put_url],
        vec!["put", "--memarts-only", &put_url, &local],
        vec!["status"],
    ] {
        let out = cli(&impostor.run_dir, &args, &[]);
        assert_refused(&out, &args.join(" "), &["untrusted memarts fleet", &run, "uid 65534"]);
    }
    // The owner's own `status`: PrefetchStatus, AdmissionStatus and Status, and nothing from the
    // victim.
    assert_eq!(impostor.requests(), before + 3, "the impostor served a request of the victim");

    // What the victim was protected from: a client that trusts the impostor gets its bytes.
    let trusting = shim(&impostor.run_dir, vec![OTHER_UID]).expect("a trusted fleet");
    assert_eq!(trusting.read(&obj.url).unwrap(), obj.poisoned);
    assert_ne!(obj.poisoned, obj.genuine);
}

#[test]
fn a_socket_served_by_another_uid_is_refused_even_in_a_run_dir_of_our_own() {
    let (obj, relay) = objects();
    let impostor = ForeignFleet::start(1, &relay.env());
    // Our own private run dir, whose socket leads to the impostor (as after a swap between the run
    // dir check and the connect): only the peer-credential check can tell.
    let own = tempfile::tempdir().unwrap();
    std::fs::write(own.path().join("fleet.json"), r#"{"slots": 1}"#).unwrap();
    std::os::unix::fs::symlink(impostor.run_dir.join("proxy-0.sock"), own.path().join("proxy-0.sock"))
        .unwrap();
    let before = impostor.requests();

    let client = shim(own.path(), vec![]).expect("the run dir is ours");
    let err = client.read(&obj.url).expect_err("a socket of uid 65534 was used");
    assert!(matches!(err, Error::Untrusted(_)), "{err}");
    assert!(err.to_string().contains("uid 65534") && err.to_string().contains("proxy-0.sock"), "{err}");
    let out = cli(own.path(), &["cat", &obj.url], &[]);
    assert_refused(&out, "cat", &["untrusted memarts fleet", "proxy-0.sock", "uid 65534"]);
    // The owner's own `status`: PrefetchStatus, AdmissionStatus and Status, and nothing from the
    // victim.
    assert_eq!(impostor.requests(), before + 3, "the impostor served a request of the victim");
}

#[test]
fn a_system_fleet_of_a_trusted_uid_is_used_and_refused_once_others_may_write_its_run_dir() {
    let m = moto();
    let bucket = m.bucket("system");
    let data = pattern(7, (2 << 20) + 5);
    m.put(&bucket, "a.bin", &data);
    let url = format!("s3://{bucket}/a.bin");
    let system = ForeignFleet::start(2, &m.env());

    // Not trusted: refused. Trusted by uid, by user name, or by the config file: used.
    assert_refused(&cli(&system.run_dir, &["cat", &url], &[]), "cat", &["untrusted memarts fleet"]);
    for trust in ["65534", "nobody", "0, 65534"] {
        let out = cli(&system.run_dir, &["cat", &url], &[("MEMARTS_TRUSTED_UIDS", trust)]);
        assert!(out.status.success(), "MEMARTS_TRUSTED_UIDS={trust}: {}", text(&out.stderr));
        assert_eq!(out.stdout, data, "MEMARTS_TRUSTED_UIDS={trust}");
    }
    let config = system.base.path().join("client.toml");
    std::fs::write(&config, format!("trusted_uids = [{OTHER_UID}]\n")).unwrap();
    let out = cli(&system.run_dir, &["cat", &url], &[("MEMARTS_CONFIG", config.to_str().unwrap())]);
    assert!(out.status.success(), "trusted_uids in the config file: {}", text(&out.stderr));
    assert_eq!(out.stdout, data);
    // The environment takes precedence over the config file.
    let out = cli(
        &system.run_dir,
        &["cat", &url],
        &[("MEMARTS_CONFIG", config.to_str().unwrap()), ("MEMARTS_TRUSTED_UIDS", "0")],
    );
    assert_refused(&out, "cat with MEMARTS_TRUSTED_UIDS=0 over the config", &["untrusted memarts fleet"]);
    assert_eq!(shim(&system.run_dir, vec![OTHER_UID]).unwrap().read(&url).unwrap(), data);

    // Once anyone may write into its run dir, anyone may have replaced its sockets.
    std::fs::set_permissions(&system.run_dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = cli(&system.run_dir, &["cat", &url], &[("MEMARTS_TRUSTED_UIDS", "65534")]);
    assert_refused(&out, "cat of a world-writable run dir", &["writable by other users", "chmod go-w"]);
    let err = shim(&system.run_dir, vec![OTHER_UID]).err().expect("a world-writable run dir was used");
    assert!(matches!(err, Error::Untrusted(_)), "{err}");
    std::fs::set_permissions(&system.run_dir, std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn the_squatted_default_run_dir_is_refused_with_the_fix_named() {
    let (obj, relay) = objects();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("e2e/squat-default-run-dir.sh");
    let victim = format!("\"$SQUAT_BIN/memarts\" cat {}", obj.url);
    let out = Command::new("bash")
        .arg(&script)
        .arg(memarts_bin().parent().unwrap())
        .args(["--", "sh", "-c", &victim])
        .env_remove("XDG_RUNTIME_DIR")
        .env_remove("MEMARTS_RUN_DIR")
        .envs(relay.env())
        .output()
        .expect("run the squat script");
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "the squat script failed:\n{stdout}\n{stderr}");
    let field = |name: &str| -> i64 {
        // Anywhere in a line: the victim's output (bytes, if it was served) need not end in one.
        let line = stdout.lines().find_map(|l| l.split(name).nth(1)).unwrap_or_else(|| {
            panic!("no {name:?} line in:\n{stdout}\n{stderr}");
        });
        line.trim().parse().unwrap_or_else(|_| panic!("{name:?} has no number in:\n{stdout}\n{stderr}"))
    };
    assert_ne!(field("victim-exit "), 0, "the victim read from the squatted run dir:\n{stdout}");
    assert!(!stdout.contains("poisoned"), "the victim got the squatter's bytes");
    for part in ["untrusted memarts fleet", "/tmp/memarts-0", "uid 65534", "MEMARTS_RUN_DIR"] {
        assert!(stderr.contains(part), "{part:?} missing from the victim's error:\n{stderr}");
    }
    // Two status calls of two slots each (each asks a slot PrefetchStatus, AdmissionStatus, then
    // Status, which counts itself), and nothing from the victim.
    assert_eq!(field("squatter-requests-after ") - field("squatter-requests-before "), 6, "{stdout}");
}

/// A pid file an attacker holds locked in a run dir of theirs, naming a process of ours.
#[test]
fn stop_and_restart_proxy_never_signal_the_pids_of_another_users_run_dir() {
    let base = tempfile::tempdir().unwrap();
    std::fs::set_permissions(base.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let run = base.path().join("run");
    std::fs::create_dir(&run).unwrap();
    let other = nix::unistd::Uid::from_raw(OTHER_UID);
    nix::unistd::chown(&run, Some(other), Some(nix::unistd::Gid::from_raw(OTHER_UID))).unwrap();
    let mut target = Command::new("sleep").arg("60").spawn().unwrap();
    let pid_file = run.join("proxy-0.pid");
    // The attacker writes our process's pid into its pid file and keeps it locked, as a live slot does.
    let mut holder = as_other_user(Path::new("/bin/sh"))
        .args([
            "-c",
            &format!("echo {} > {p}; exec flock -x {p} sleep 60", target.id(), p = pid_file.display()),
        ])
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::fs::read_to_string(&pid_file).map_or(true, |t| t.trim().is_empty()) {
        assert!(std::time::Instant::now() < deadline, "the attacker's pid file never appeared");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(200)); // flock takes the lock after the write

    for args in [["stop_proxy", "--grace", "1"], ["restart_proxy", "--grace", "1"]] {
        let out = cli(&run, &args, &[]);
        assert!(!out.status.success(), "{} went ahead in another user's run dir", args[0]);
        let err = text(&out.stderr);
        assert!(err.contains("belongs to uid 65534") && err.contains(&run.display().to_string()), "{err}");
        assert!(target.try_wait().unwrap().is_none(), "{} signalled the pid the attacker named", args[0]);
    }
    let _ = holder.kill();
    let _ = holder.wait();
    let _ = target.kill();
    let _ = target.wait();
}

#[test]
fn a_client_of_an_allowed_uid_reads_local_paths_only_under_local_roots() {
    let data = tempfile::tempdir().unwrap();
    std::fs::set_permissions(data.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let (shared, private) = (data.path().join("shared"), data.path().join("private"));
    std::fs::create_dir(&shared).unwrap();
    std::fs::create_dir(&private).unwrap();
    let open = pattern(11, (1 << 20) + 77);
    let secret = pattern(12, 4096);
    std::fs::write(shared.join("open.bin"), &open).unwrap();
    std::fs::write(private.join("secret.bin"), &secret).unwrap();
    for f in [shared.join("open.bin"), private.join("secret.bin")] {
        // Neither is readable by uid 65534 itself: what it reads, it reads with the proxy's rights.
        std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    std::os::unix::fs::symlink(private.join("secret.bin"), shared.join("link.bin")).unwrap();

    let config = data.path().join("fleet.toml");
    std::fs::write(
        &config,
        format!("allowed_uids = [{OTHER_UID}]\nlocal_roots = [{:?}]\n", shared.display().to_string()),
    )
    .unwrap();
    let fleet = Fleet::start(1, &[("MEMARTS_CONFIG", config.to_str().unwrap())]);
    // Its run dir, sockets and fleet.json are open to the allowed uid already; the test's private
    // temp dir around them is not.
    std::fs::set_permissions(fleet.dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let p = |path: &Path| path.display().to_string();
    // The proxy's own uid is not limited, and what it read is cached: the rule must hold for hits too.
    let out = fleet.memarts(&["cat", &p(&private.join("secret.bin"))]);
    assert!(out.status.success() && out.stdout == secret, "root: {}", text(&out.stderr));

    let bin = binaries_for_everyone(data.path());
    let as_other = |args: &[&str]| {
        as_other_user(&bin.join("memarts"))
            .args(args)
            .env("MEMARTS_RUN_DIR", &fleet.run_dir)
            .env("MEMARTS_TRUSTED_UIDS", "0")
            .env("HOME", data.path())
            .env_remove("MEMARTS_CONFIG")
            .output()
            .expect("run memarts as uid 65534")
    };
    let out = as_other(&["cat", &p(&shared.join("open.bin"))]);
    assert!(out.status.success(), "a file under local_roots: {}", text(&out.stderr));
    assert_eq!(out.stdout, open);
    for path in [
        private.join("secret.bin"),
        shared.join("../private/secret.bin"),
        shared.join("link.bin"),
        data.path().join("shared-sibling/x.bin"),
    ] {
        let out = as_other(&["cat", &p(&path)]);
        assert_refused(&out, &format!("cat {}", path.display()), &["permission denied", "local_roots"]);
    }
    let out = as_other(&["ls", &p(&private)]);
    assert_refused(&out, "ls of a directory outside the roots", &["permission denied", "local_roots"]);
    // Writes and deletes of local paths are never done for another uid, even under a root.
    let upload = data.path().join("upload.bin");
    std::fs::write(&upload, b"x").unwrap();
    std::fs::set_permissions(&upload, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = as_other(&["put", &p(&shared.join("new.bin")), &p(&upload)]);
    assert_refused(&out, "put under a root", &["permission denied", "may not write"]);
    assert!(!shared.join("new.bin").exists(), "the proxy wrote a file for another uid");
}
