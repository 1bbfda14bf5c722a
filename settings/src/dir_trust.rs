//! Whether a directory memarts keeps its state in may be trusted: one rule for the run dir (S1, S5)
//! and the cache dir (S9). Such a directory must belong to the process's own uid, or to one it
//! trusts explicitly (a client's `MEMARTS_TRUSTED_UIDS`; root, for the cache dir), and nobody else
//! may write into it (no group or world write bit). Whoever can put files there can hand memarts
//! their sockets, pid files, chunk files or metadata snapshots (a CRC32C is no MAC), or have files
//! deleted by the cleaning at start-up. Where a caller looks at the entry itself rather than
//! through it (the cache dir's directories, which start-up cleans), a symlink is refused too.
//!
//! [`check`] is the rule, over what `stat` says; [`UntrustedDir`] names the directory, what is
//! wrong and the fix.

use std::path::PathBuf;

use nix::unistd::{Uid, User};

/// Which directory: its fix names the settings that choose another one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DirRole {
    /// The fleet's run dir (sockets, pid files, `fleet.json`).
    Run,
    /// The cache dir or one of its directories (chunks, temp files, snapshots).
    Cache,
}

impl DirRole {
    fn noun(self) -> &'static str {
        match self {
            DirRole::Run => "run dir",
            DirRole::Cache => "cache dir",
        }
    }

    /// The settings that point memarts at another directory of this role.
    fn settings(self) -> &'static str {
        match self {
            DirRole::Run => "MEMARTS_RUN_DIR, or XDG_RUNTIME_DIR",
            DirRole::Cache => "MEMARTS_CACHE_DIR, or XDG_CACHE_HOME",
        }
    }
}

/// What is wrong with a directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Problem {
    /// A symlink where a directory of ours should be.
    Symlink,
    NotADirectory,
    /// It belongs to `owner`, neither `me` nor a uid trusted.
    Owner {
        owner: u32,
        me: u32,
    },
    /// Other users may write into it (`mode`: its permission bits).
    Writable {
        mode: u32,
    },
}

/// The rule: whether a directory whose `stat` says `uid` and `mode` (file type bits included; an
/// `lstat`'s, where a symlink is to be refused) may be trusted by a process of uid `me` that also
/// trusts the uids `trusted`.
pub fn check(uid: u32, mode: u32, me: u32, trusted: &[u32]) -> Result<(), Problem> {
    match mode & libc_mode::S_IFMT {
        libc_mode::S_IFDIR => {}
        libc_mode::S_IFLNK => return Err(Problem::Symlink),
        _ => return Err(Problem::NotADirectory),
    }
    if uid != me && !trusted.contains(&uid) {
        return Err(Problem::Owner { owner: uid, me });
    }
    if mode & 0o022 != 0 {
        return Err(Problem::Writable { mode: mode & 0o7777 });
    }
    Ok(())
}

/// The file type bits of `st_mode` (as `libc` spells them; settings does not link `libc`).
mod libc_mode {
    pub const S_IFMT: u32 = 0o170000;
    pub const S_IFDIR: u32 = 0o040000;
    pub const S_IFLNK: u32 = 0o120000;
}

/// A directory that failed [`check`]: which one, in which role, and what is wrong. Its message says
/// how to fix it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.message())]
pub struct UntrustedDir {
    pub path: PathBuf,
    pub role: DirRole,
    pub problem: Problem,
}

impl UntrustedDir {
    fn message(&self) -> String {
        let (dir, noun, settings) = (self.path.display(), self.role.noun(), self.role.settings());
        match (self.problem, self.role) {
            (Problem::Owner { owner, me }, DirRole::Run) => format!(
                "{dir} belongs to {}, but memarts runs as {}: another user created it. Use a run dir \
                 of your own ({settings}), or remove it",
                who(owner),
                who(me)
            ),
            (Problem::Owner { owner, me }, DirRole::Cache) => format!(
                "{dir} belongs to {}, but memarts runs as {}: another user may have made it to feed \
                 your jobs their bytes. Use a cache dir of your own ({settings}), or remove it",
                who(owner),
                who(me)
            ),
            (Problem::Writable { mode }, DirRole::Run) => format!(
                "{dir} is writable by other users (mode {mode:04o}), so its pid files may not be ours; \
                 run `chmod go-w {dir}` after checking them"
            ),
            (Problem::Writable { mode }, DirRole::Cache) => format!(
                "{dir} is writable by other users (mode {mode:04o}), so its files may not be ours; run \
                 `chmod go-w {dir}` after checking what it holds, or use a cache dir of your own \
                 ({settings})"
            ),
            (Problem::Symlink, _) => format!(
                "{dir} is a symlink, which memarts does not follow in its {noun} (start-up removes \
                 files there): remove it (`rm {dir}`; memarts makes a directory in its place), or use \
                 a {noun} of your own ({settings}) named without a symlink"
            ),
            (Problem::NotADirectory, _) => format!("{dir} is not a directory"),
        }
    }
}

/// The uid this process creates files as, which its directories must belong to.
pub fn own_uid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// `uid 65534 (nobody)`, or `uid 4242` for a uid without a passwd entry.
pub fn who(uid: u32) -> String {
    match User::from_uid(Uid::from_raw(uid)) {
        Ok(Some(user)) => format!("uid {uid} ({})", user.name),
        _ => format!("uid {uid}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    const DIR: u32 = 0o040000;

    #[test]
    fn only_a_private_directory_of_a_trusted_uid_passes() {
        assert_eq!(check(7, DIR | 0o700, 7, &[]), Ok(()));
        assert_eq!(check(7, DIR | 0o755, 7, &[]), Ok(()));
        assert_eq!(check(0, DIR | 0o711, 7, &[0]), Ok(()), "a trusted uid's");
        assert_eq!(check(8, DIR | 0o700, 7, &[0]), Err(Problem::Owner { owner: 8, me: 7 }));
        assert_eq!(check(7, DIR | 0o770, 7, &[]), Err(Problem::Writable { mode: 0o770 }));
        assert_eq!(check(7, DIR | 0o1777, 7, &[]), Err(Problem::Writable { mode: 0o1777 }));
        assert_eq!(check(7, DIR | 0o702, 7, &[]), Err(Problem::Writable { mode: 0o702 }));
        assert_eq!(check(7, 0o120777, 7, &[]), Err(Problem::Symlink));
        assert_eq!(check(7, 0o100600, 7, &[]), Err(Problem::NotADirectory));
        // A squatter's directory is refused for its owner before its mode is looked at.
        assert_eq!(check(8, DIR | 0o777, 7, &[]), Err(Problem::Owner { owner: 8, me: 7 }));
    }

    #[test]
    fn what_stat_says_of_real_directories_follows_the_rule() {
        let dir = tempfile::tempdir().unwrap();
        let me = nix::unistd::geteuid().as_raw();
        let lstat = |p: &std::path::Path| std::fs::symlink_metadata(p).unwrap();
        let m = lstat(dir.path());
        assert_eq!(check(m.uid(), m.mode(), me, &[]), Ok(()));
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o770)).unwrap();
        let m = lstat(dir.path());
        assert_eq!(check(m.uid(), m.mode(), me, &[]), Err(Problem::Writable { mode: 0o770 }));
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(dir.path(), &link).unwrap();
        let m = lstat(&link);
        assert_eq!(check(m.uid(), m.mode(), me, &[]), Err(Problem::Symlink));
    }

    #[test]
    fn each_refusal_names_the_directory_what_is_wrong_and_the_fix() {
        let refuse = |role, problem| UntrustedDir { path: "/tmp/x".into(), role, problem }.to_string();
        let owner = Problem::Owner { owner: 65534, me: 4242 };
        let cases = [
            (
                refuse(DirRole::Cache, owner),
                vec!["uid 65534", "uid 4242", "MEMARTS_CACHE_DIR", "XDG_CACHE_HOME"],
            ),
            (refuse(DirRole::Run, owner), vec!["uid 65534", "MEMARTS_RUN_DIR"]),
            (
                refuse(DirRole::Cache, Problem::Writable { mode: 0o775 }),
                vec!["mode 0775", "chmod go-w /tmp/x"],
            ),
            (refuse(DirRole::Run, Problem::Writable { mode: 0o777 }), vec!["mode 0777", "chmod go-w /tmp/x"]),
            (refuse(DirRole::Cache, Problem::Symlink), vec!["a symlink", "MEMARTS_CACHE_DIR"]),
            (refuse(DirRole::Cache, Problem::NotADirectory), vec!["not a directory"]),
        ];
        for (message, parts) in cases {
            assert!(message.starts_with("/tmp/x "), "{message}");
            for part in parts {
                assert!(message.contains(part), "{part:?} missing from: {message}");
            }
        }
    }
}
