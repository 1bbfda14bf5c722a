//! Which fleets a client trusts (promise S5). A fleet is whatever answers on the sockets of a run
//! dir, and a run dir is only a name: any local user can create `/tmp/memarts-<uid>` before its
//! owner does, start a fleet in it and feed the owner's training job its own bytes (and receive
//! everything the job writes). So before a byte is read or written, a client checks that
//!
//! 1. the run dir belongs to the client's own uid or to one it trusts explicitly
//!    (`MEMARTS_TRUSTED_UIDS`, e.g. root for a system-wide fleet run by systemd), and that nobody
//!    else can write into it (no group or world write bit), so its sockets cannot be swapped; and
//! 2. the process on the other end of every socket it connects to (`SO_PEERCRED`) runs as the run
//!    dir's owner, which also covers a run dir swapped or a socket replaced after check 1.
//!
//! Either failure is a typed [`Error::Untrusted`] that names the run dir, its owner and the fix;
//! the client never falls back to reading the origin directly, which would hide the attack.

use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::path::Path;

use memarts_settings::dir_trust::{self, who, Problem};
use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};

use crate::error::{Error, Result};

/// The environment variable that lists the uids (or user names) whose fleets a client trusts
/// besides its own.
pub const TRUSTED_UIDS_VAR: &str = "MEMARTS_TRUSTED_UIDS";

/// The uid this client runs as (the one `SO_PEERCRED` reports to the proxy).
pub fn own_uid() -> u32 {
    dir_trust::own_uid()
}

/// Checks the run dir (check 1 above, the rule of `memarts_settings::dir_trust` that the proxy's run
/// dir and cache dir follow too) and returns the uid its proxies must run as.
pub fn check_run_dir(run_dir: &Path, trusted: &[u32]) -> Result<u32> {
    let meta = match std::fs::metadata(run_dir) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(Error::Unavailable(format!(
                "no memarts fleet in {} (it does not exist); start one with `memarts start_proxy N`",
                run_dir.display()
            )))
        }
        Err(e) => return Err(Error::Unavailable(format!("memarts run dir {}: {e}", run_dir.display()))),
    };
    let dir = run_dir.display();
    match dir_trust::check(meta.uid(), meta.mode(), own_uid(), trusted) {
        Ok(()) => Ok(meta.uid()),
        Err(Problem::NotADirectory | Problem::Symlink) => {
            Err(Error::Untrusted(format!("refusing the memarts run dir {dir}: it is not a directory")))
        }
        Err(Problem::Owner { owner, me }) => Err(Error::Untrusted(format!(
            "refusing the memarts fleet in {dir}: the directory belongs to {}, not to you ({}), and \
             {TRUSTED_UIDS_VAR} does not list uid {owner}. Another user may have created it to serve \
             your job their data. Use your own fleet (point MEMARTS_RUN_DIR at its run dir, or remove \
             {dir} and run `memarts start_proxy N`); if this is a fleet you trust, such as a system \
             fleet, set {TRUSTED_UIDS_VAR}={owner}",
            who(owner),
            who(me)
        ))),
        Err(Problem::Writable { mode }) => Err(Error::Untrusted(format!(
            "refusing the memarts fleet in {dir}: the directory is writable by other users (mode \
             {mode:04o}), so anyone could replace its sockets; run `chmod go-w {dir}` (a fleet's run \
             dir is 0700, or 0711/0755 when it serves other users)"
        ))),
    }
}

/// Checks the peer of a freshly connected proxy socket (check 2 above), before a byte is sent.
pub fn check_peer(stream: &UnixStream, socket: &Path, owner: u32) -> Result<()> {
    let cred = getsockopt(stream, PeerCredentials).map_err(std::io::Error::from)?;
    let peer = cred.uid();
    if peer != owner {
        return Err(Error::Untrusted(format!(
            "refusing the memarts proxy socket {}: it is served by a process of {}, but the fleet's \
             run dir belongs to {}, so another user's process holds the socket; restart the fleet \
             (`memarts stop_proxy`, then `memarts start_proxy N`) and look for who replaced it",
            socket.display(),
            who(peer),
            who(owner)
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn an_own_private_run_dir_is_trusted_and_a_writable_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(check_run_dir(dir.path(), &[]).unwrap(), own_uid());
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(check_run_dir(dir.path(), &[]).unwrap(), own_uid());
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = check_run_dir(dir.path(), &[]).unwrap_err();
        assert!(matches!(err, Error::Untrusted(_)), "{err}");
        assert!(err.to_string().contains("chmod go-w"), "{err}");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o720)).unwrap();
        assert!(matches!(check_run_dir(dir.path(), &[]), Err(Error::Untrusted(_))));
    }

    #[test]
    fn a_missing_run_dir_is_no_fleet_and_a_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let err = check_run_dir(&dir.path().join("absent"), &[]).unwrap_err();
        assert!(matches!(err, Error::Unavailable(_)), "{err}");
        let file = dir.path().join("file");
        std::fs::write(&file, b"").unwrap();
        assert!(matches!(check_run_dir(&file, &[]), Err(Error::Untrusted(_))));
    }

    #[test]
    fn a_run_dir_of_another_uid_is_refused_unless_trusted() {
        if !nix::unistd::geteuid().is_root() {
            panic!("this test chowns a directory to another uid: run it as root (CI does)");
        }
        let dir = tempfile::tempdir().unwrap();
        nix::unistd::chown(dir.path(), Some(nix::unistd::Uid::from_raw(65534)), None).unwrap();
        let err = check_run_dir(dir.path(), &[]).unwrap_err().to_string();
        for part in ["uid 65534", &dir.path().display().to_string(), "MEMARTS_TRUSTED_UIDS=65534"] {
            assert!(err.contains(part), "{part:?} missing from: {err}");
        }
        assert_eq!(check_run_dir(dir.path(), &[65534]).unwrap(), 65534);
    }

    #[test]
    fn a_peer_of_another_uid_is_refused() {
        let (a, _b) = UnixStream::pair().unwrap();
        check_peer(&a, Path::new("pair"), own_uid()).unwrap();
        let err = check_peer(&a, Path::new("pair"), own_uid() + 1).unwrap_err();
        assert!(matches!(err, Error::Untrusted(_)), "{err}");
    }
}
