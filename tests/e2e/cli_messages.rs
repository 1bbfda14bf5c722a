//! What the CLI says (issue 16, item 5): errors go to stderr and say a thing once, through the
//! fleet and without one; a missing bucket is said so, not retried; an s3:// URL with nothing
//! configured names the variables to set at once, with no request; "1 proxy ready"; the proxy
//! logs written to files carry no ANSI colour codes; and `--help` names each flag's variable.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::{fleet::memarts_bin, moto, text, Fleet};

#[test]
fn errors_say_what_happened_to_which_url_once_on_stderr() {
    let bucket = moto().bucket("messages");
    moto().put(&bucket, "there", b"x");
    let fleet = Fleet::new(&[]);
    let out = fleet.memarts(&["start_proxy", "1"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("memarts: 1 proxy ready in"), "{}", text(&out.stdout));
    let missing = format!("s3://{bucket}/missing");
    for through_fleet in [true, false] {
        if !through_fleet {
            fleet.stop_proxy();
        }
        for args in [vec!["cat", &missing], vec!["stat", &missing], vec!["cp", &missing, "/dev/null"]] {
            let out = fleet.memarts(&args);
            assert!(!out.status.success(), "{args:?} succeeded");
            assert!(out.stdout.is_empty(), "{args:?} wrote to stdout: {}", text(&out.stdout));
            assert_eq!(
                text(&out.stderr),
                format!("memarts: {missing}: not found at the origin\n"),
                "{args:?} (through the fleet: {through_fleet})"
            );
        }
        // Another scheme for the same store: the object is still named once.
        let obs = format!("obs://{bucket}/missing");
        let out = fleet.memarts(&["cat", &obs]);
        let err = text(&out.stderr);
        assert!(!out.status.success() && err.contains("not found at the origin"), "{err}");
        assert_eq!(err.matches(&format!("{bucket}/missing")).count(), 1, "the object named twice: {err}");
        let out = fleet.memarts(&["ls", "s3://no-such-bucket-here/"]);
        let err = text(&out.stderr);
        assert!(!out.status.success());
        assert_eq!(
            err, "memarts: s3://no-such-bucket-here/: no such bucket at the origin\n",
            "(fleet: {through_fleet})"
        );
    }
}

#[test]
fn an_s3_url_with_nothing_configured_names_the_variables_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let out = Command::new(memarts_bin())
        .args(["cat", "s3://bucket/key"])
        .env("MEMARTS_RUN_DIR", dir.path().join("run"))
        .env("MEMARTS_CACHE_DIR", dir.path().join("cache"))
        .env_remove("AWS_ENDPOINT_URL")
        .env_remove("AWS_ACCESS_KEY_ID")
        .env_remove("AWS_SECRET_ACCESS_KEY")
        .env_remove("AWS_SESSION_TOKEN")
        .env_remove("MEMARTS_CREDENTIALS_FILE")
        .output()
        .expect("run memarts");
    let took = started.elapsed();
    let err = text(&out.stderr);
    assert!(!out.status.success());
    for needle in ["s3://bucket/key: no object store is configured", "AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID"]
    {
        assert!(err.contains(needle), "the error does not say {needle:?}: {err}");
    }
    assert!(!err.contains("gave up after"), "it retried: {err}");
    assert!(took < Duration::from_secs(1), "took {took:?}: it went to the network");
}

#[test]
fn proxy_logs_in_files_have_no_colour_codes() {
    let fleet = Fleet::start(1, &[("MEMARTS_LOG", "debug")]);
    // Something worth a log line: a read of a missing object.
    let _ = fleet.memarts(&["cat", &format!("s3://{}/nothing", moto().bucket("nocolour"))]);
    fleet.stop_proxy();
    let log = std::fs::read(fleet.run_dir.join("proxy-0.log")).expect("the slot's log");
    assert!(log.len() > 100, "the log is nearly empty: {}", text(&log));
    assert!(!log.contains(&0x1b), "ANSI escape codes in the log file:\n{}", text(&log));
}

#[test]
fn help_names_the_environment_variable_of_each_flag_that_has_one() {
    let help = |args: &[&str]| {
        let out = Command::new(memarts_bin()).args(args).output().expect("run memarts");
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
        text(&out.stdout)
    };
    let top = help(&["--help"]);
    for var in ["MEMARTS_RUN_DIR", "MEMARTS_CONFIG"] {
        assert!(top.contains(&format!("[env: {var}]")), "memarts --help does not name {var}:\n{top}");
    }
    let start = help(&["start_proxy", "--help"]);
    for var in [
        "MEMARTS_CACHE_DIR",
        "MEMARTS_CACHE_CAPACITY",
        "MEMARTS_IO_ENGINE",
        "MEMARTS_EVICTION",
        "AWS_ENDPOINT_URL",
        "MEMARTS_CREDENTIALS_FILE",
        "MEMARTS_CLUSTER",
        "MEMARTS_NODE_ID",
        "MEMARTS_PEER_ADDRESS",
        "MEMARTS_PEER_LISTEN",
    ] {
        assert!(start.contains(&format!("[env: {var}]")), "start_proxy --help does not name {var}:\n{start}");
    }
}
