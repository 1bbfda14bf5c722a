//! A worker that forks after using the shim (a PyTorch DataLoader does): the child must not reuse
//! the parent's connections, and parent and child must both keep reading correct bytes.

use std::time::{Duration, Instant};

use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};

use crate::common::{moto, pattern, text, Fleet};

const CS: u64 = 64 << 10;

/// Set in the process of its own the fork test runs in.
const ALONE: &str = "MEMARTS_E2E_FORK_ALONE";

const NAME: &str = "fork::a_forked_child_opens_its_own_connections_and_both_read_correctly";

#[test]
fn a_forked_child_opens_its_own_connections_and_both_read_correctly() {
    // fork() copies one thread: a lock another thread holds at that instant stays held in the child
    // forever. In this binary other tests start threads all the time, and std takes a global mutex
    // for each new thread (its thread-info table), so a child that starts threads (the shim reads
    // chunks in parallel) could wait forever: seen once. The test runs alone, in this binary run
    // again for it, where no other thread of the process starts one while it forks.
    if std::env::var_os(ALONE).is_none() {
        let exe = std::env::current_exe().expect("the test binary");
        let out = std::process::Command::new(exe)
            .args(["--exact", NAME, "--test-threads=1", "--nocapture"])
            .env(ALONE, "1")
            .output()
            .expect("run the fork test alone");
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert!(out.status.success(), "the fork test failed:\n{stdout}{stderr}");
        assert!(stdout.contains("1 passed"), "the fork test did not run:\n{stdout}");
        return;
    }
    let bucket = moto().bucket("fork");
    let want = pattern(500, 12 * CS as usize + 3);
    moto().put(&bucket, "o", &want);
    let fleet = Fleet::start(2, &[]);
    let client = fleet.client(CS);
    let url = format!("s3://{bucket}/o");
    assert_eq!(client.read(&url).unwrap(), want, "parent before fork");
    let mut children = Vec::new();
    for _ in 0..4 {
        // SAFETY: the child only uses the shim (std sockets and files, no lock another thread could
        // hold: this test runs alone in its process and its own client is idle while forking) and
        // leaves with _exit.
        match unsafe { nix::unistd::fork() }.expect("fork") {
            nix::unistd::ForkResult::Child => {
                let ok = (0..20).all(|_| client.read(&url).map(|got| got == want).unwrap_or(false));
                // SAFETY: _exit ends the child without running the parent's destructors or atexit.
                unsafe { libc::_exit(if ok { 0 } else { 1 }) };
            }
            nix::unistd::ForkResult::Parent { child } => children.push(child),
        }
    }
    for _ in 0..20 {
        assert_eq!(client.read(&url).unwrap(), want, "parent while children read");
    }
    // A child that hangs fails the test rather than the whole run.
    let deadline = Instant::now() + Duration::from_secs(60);
    for child in children {
        let status = loop {
            match waitpid(child, Some(WaitPidFlag::WNOHANG)).unwrap() {
                WaitStatus::StillAlive if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                WaitStatus::StillAlive => {
                    let _ = nix::sys::signal::kill(child, nix::sys::signal::Signal::SIGKILL);
                    panic!("a forked child still reads after 60 s");
                }
                status => break status,
            }
        };
        assert_eq!(status, WaitStatus::Exited(child, 0), "a forked child read wrong bytes or failed");
    }
}
