//! `memarts unmount MOUNTPOINT`: `fusermount3 -u` (or umount(2) as root), which ends the mount
//! process; a mount whose process died (`kill -9`: "Transport endpoint is not connected", or
//! "Software caused connection abort") is unmounted the same way. Only FUSE mounts are touched.

use std::path::Path;
use std::process::{Command, ExitCode};

use anyhow::{bail, Context, Result};

use crate::cli::UnmountArgs;

/// The file system type of the mount at `path` (`/proc/self/mountinfo`), if something is mounted
/// exactly there.
pub fn mounted_type(path: &Path) -> Result<Option<String>> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").context("/proc/self/mountinfo")?;
    let want = path.to_string_lossy();
    // Fields: id parent major:minor root mountpoint options... - fstype source superoptions.
    // Spaces and other odd bytes in paths are escaped as \040 and the like.
    Ok(info.lines().rev().find_map(|line| {
        let mut fields = line.split(' ');
        let mountpoint = fields.nth(4)?;
        if unescape(mountpoint) != want {
            return None;
        }
        let rest = line.split(" - ").nth(1)?;
        rest.split(' ').next().map(str::to_string)
    }))
}

fn unescape(s: &str) -> String {
    let mut out = Vec::with_capacity(s.len());
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 4], 8) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn fusermount() -> Option<&'static str> {
    ["fusermount3", "fusermount"].into_iter().find(|bin| {
        Command::new(bin).arg("-V").output().is_ok_and(|o| o.status.success() || !o.stderr.is_empty())
    })
}

/// Unmounts `path` lazily (it goes once its open files close).
pub fn detach(path: &Path) -> Result<()> {
    unmount_at(path, true)
}

fn unmount_at(path: &Path, lazy: bool) -> Result<()> {
    if let Some(bin) = fusermount() {
        let mut cmd = Command::new(bin);
        cmd.arg(if lazy { "-uz" } else { "-u" }).arg(path);
        let out = cmd.output().with_context(|| format!("running {bin}"))?;
        if out.status.success() {
            return Ok(());
        }
        let why = String::from_utf8_lossy(&out.stderr).trim().to_string();
        if !nix::unistd::geteuid().is_root() {
            bail!("{bin} -u {}: {why}", path.display());
        }
    }
    let flags = if lazy { nix::mount::MntFlags::MNT_DETACH } else { nix::mount::MntFlags::empty() };
    nix::mount::umount2(path, flags).with_context(|| format!("umount {}", path.display()))?;
    Ok(())
}

pub fn unmount(args: &UnmountArgs) -> Result<ExitCode> {
    // Not canonicalized: a stale mount point cannot be stat'ed (ENOTCONN).
    let path = crate::settings::absolute(args.mountpoint.clone())?;
    let path = Path::new(&path);
    match mounted_type(path)? {
        None => bail!("nothing is mounted on {}", path.display()),
        Some(t) if !t.starts_with("fuse") => {
            bail!("{} is a {t} mount, not a memarts (FUSE) one: left alone", path.display())
        }
        Some(_) => {}
    }
    // The kernel says ENOTCONN, or ECONNABORTED while it is still tearing the connection down.
    let stale = matches!(std::fs::metadata(path), Err(e)
        if matches!(e.raw_os_error(), Some(libc::ENOTCONN | libc::ECONNABORTED)));
    unmount_at(path, args.lazy).map_err(|e| {
        if e.to_string().contains("busy") {
            e.context(format!("{} has files open; close them, or use --lazy", path.display()))
        } else {
            e
        }
    })?;
    if stale {
        println!("memarts: unmounted {} (its mount process had died)", path.display());
    } else {
        println!("memarts: unmounted {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_paths_are_unescaped() {
        assert_eq!(unescape(r"/mnt/a\040b"), "/mnt/a b");
        assert_eq!(unescape(r"/plain"), "/plain");
        assert_eq!(unescape(r"/x\"), r"/x\");
    }

    #[test]
    fn the_root_is_mounted_and_a_plain_dir_is_not() {
        assert!(mounted_type(Path::new("/")).unwrap().is_some());
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(mounted_type(dir.path()).unwrap(), None);
    }
}
