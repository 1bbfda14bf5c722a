//! A worker that forks after using the shim (a PyTorch DataLoader does): the child must not reuse
//! the parent's connections, and parent and child must both keep reading correct bytes.

use crate::common::{moto, pattern, Fleet};

const CS: u64 = 64 << 10;

#[test]
fn a_forked_child_opens_its_own_connections_and_both_read_correctly() {
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
        // hold: this test's own client is idle while forking) and leaves with _exit.
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
    for child in children {
        let status = nix::sys::wait::waitpid(child, None).unwrap();
        assert_eq!(
            status,
            nix::sys::wait::WaitStatus::Exited(child, 0),
            "a forked child read wrong bytes or failed"
        );
    }
}
