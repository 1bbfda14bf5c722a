use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use memarts_settings::dir_trust::Problem;

use super::*;

/// Files named like temp files of dead writers (`<id>.<pid>.<serial>.tmp`), which start-up removes
/// from a trusted `v1/tmp`.
const CANARIES: [&str; 3] = ["chunk.999991.tmp", "x.40000001.y", "a.999992.1.only.tmp"];

fn plant(dir: &Path) -> Vec<PathBuf> {
    std::fs::create_dir_all(dir).unwrap();
    CANARIES
        .iter()
        .map(|name| {
            let path = dir.join(name);
            std::fs::write(&path, b"canary").unwrap();
            path
        })
        .collect()
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn refusal(result: Result<CacheRoot, CacheDirError>) -> (PathBuf, Problem) {
    match result {
        Err(CacheDirError::Untrusted(u)) => (u.path, u.problem),
        other => panic!("not refused: {other:?}"),
    }
}

#[test]
fn a_new_cache_dir_is_made_private_and_one_of_an_earlier_version_is_used_as_it_is() {
    let base = tempfile::tempdir().unwrap();
    let root = base.path().join("a/cache");
    // All of them made here, 0700: one made later by whoever writes there first would follow the
    // umask (the cluster's roster dir did), and a group-writable one be refused at the next start.
    CacheRoot::open(&root).unwrap();
    let mut dirs = vec![root.clone(), root.join("v1")];
    dirs.extend(SUBDIRS.map(|name| root.join("v1").join(name)));
    for dir in dirs {
        assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o700, "{dir:?}");
    }
    // What earlier versions made: every directory 0700, ours; its leftover temp files go.
    let old = base.path().join("old");
    for name in SUBDIRS {
        std::fs::create_dir_all(old.join("v1").join(name)).unwrap();
    }
    for dir in ["", "v1", "v1/chunks", "v1/tmp", "v1/memarts", "v1/meta", "v1/cluster"] {
        chmod(&old.join(dir), 0o700);
    }
    let planted = plant(&old.join("v1/tmp"));
    let tree = CacheRoot::open(&old).unwrap();
    assert_eq!(remove_files_where(&tree.subdir("tmp").unwrap(), |_| true).unwrap(), 3);
    assert!(planted.iter().all(|p| !p.exists()));
}

#[test]
fn a_directory_others_can_write_into_is_refused_wherever_it_is_in_the_tree() {
    for dir in ["", "v1", "v1/chunks", "v1/tmp", "v1/memarts", "v1/meta", "v1/cluster"] {
        let base = tempfile::tempdir().unwrap();
        let root = base.path().join("cache");
        CacheRoot::open(&root).unwrap();
        std::fs::create_dir_all(root.join(dir)).unwrap();
        let planted = plant(&root.join("v1/tmp"));
        chmod(&root.join(dir), 0o770);
        let (path, problem) = refusal(CacheRoot::open(&root));
        assert_eq!((path, problem), (root.join(dir), Problem::Writable { mode: 0o770 }), "{dir:?}");
        // Through the stores too, and nothing under the refused dir is deleted.
        let err = crate::memarts_only::OnlyStore::open(&root, None).err().expect("refused");
        assert!(err.to_string().contains("chmod go-w"), "{err}");
        assert!(planted.iter().all(|p| p.exists()), "{dir:?}: a canary was deleted");
    }
}

#[test]
fn a_symlinked_tmp_is_refused_and_the_files_it_leads_to_stay() {
    let base = tempfile::tempdir().unwrap();
    let root = base.path().join("cache");
    CacheRoot::open(&root).unwrap();
    let elsewhere = base.path().join("elsewhere");
    let planted = plant(&elsewhere);
    std::fs::remove_dir(root.join("v1/tmp")).unwrap();
    std::os::unix::fs::symlink(&elsewhere, root.join("v1/tmp")).unwrap();
    assert_eq!(refusal(CacheRoot::open(&root)), (root.join("v1/tmp"), Problem::Symlink));
    let engine = std::sync::Arc::new(crate::chunk_store::PreadEngine);
    let err = crate::chunk_store::ChunkStore::open(&root, engine).expect_err("refused");
    assert!(err.to_string().contains("is a symlink"), "{err}");
    assert!(planted.iter().all(|p| p.exists()), "a canary was deleted");
    // The cache root itself a symlink of ours (to a disk elsewhere) leads to the directory it names,
    // checked as any: here the one whose tmp is a symlink.
    let link = base.path().join("link");
    std::os::unix::fs::symlink(&root, &link).unwrap();
    assert_eq!(refusal(CacheRoot::open(&link)), (root.join("v1/tmp"), Problem::Symlink));
    let slashed = PathBuf::from(format!("{}/", link.display()));
    assert_eq!(refusal(CacheRoot::open(&slashed)), (root.join("v1/tmp"), Problem::Symlink), "a trailing /");
    std::fs::remove_file(root.join("v1/tmp")).unwrap();
    assert_eq!(CacheRoot::open(&link).unwrap().path(), root.as_path());
    // One of another uid is refused.
    if nix::unistd::geteuid().is_root() {
        let theirs = base.path().join("theirs");
        std::os::unix::fs::symlink(&root, &theirs).unwrap();
        std::os::unix::fs::lchown(&theirs, Some(65534), Some(65534)).unwrap();
        assert_eq!(
            refusal(CacheRoot::open(&theirs)),
            (theirs.clone(), Problem::Owner { owner: 65534, me: 0 })
        );
    }
    // A file where a directory should be is no trust problem, only an I/O error.
    std::fs::write(base.path().join("file"), b"").unwrap();
    let err = CacheRoot::open(&base.path().join("file")).unwrap_err();
    assert!(
        matches!(&err, CacheDirError::Io { source, .. } if source.raw_os_error() == Some(libc::ENOTDIR)),
        "{err}"
    );
}

#[test]
fn cleaning_follows_the_directory_checked_not_a_symlink_swapped_in_after() {
    let base = tempfile::tempdir().unwrap();
    let root = base.path().join("cache");
    let tree = CacheRoot::open(&root).unwrap();
    let tmp = tree.subdir("tmp").unwrap();
    let ours = plant(&root.join("v1/tmp"));
    // Between the check and the cleaning, `tmp` moves away and a symlink takes its place.
    std::fs::rename(root.join("v1/tmp"), root.join("v1/moved")).unwrap();
    let elsewhere = base.path().join("elsewhere");
    let planted = plant(&elsewhere);
    std::os::unix::fs::symlink(&elsewhere, root.join("v1/tmp")).unwrap();
    assert_eq!(remove_files_where(&tmp, |name| name != "x.40000001.y").unwrap(), 2);
    assert!(planted.iter().all(|p| p.exists()), "cleaned through the symlink");
    let left: Vec<_> =
        std::fs::read_dir(root.join("v1/moved")).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, ["x.40000001.y"], "{ours:?}");
}

#[test]
fn only_regular_files_are_removed() {
    let base = tempfile::tempdir().unwrap();
    let tree = CacheRoot::open(base.path()).unwrap();
    let tmp = tree.path_of("tmp");
    let fd = tree.subdir("tmp").unwrap();
    std::fs::create_dir(tmp.join("d.1.2.tmp")).unwrap();
    std::os::unix::fs::symlink("/etc/hostname", tmp.join("l.1.2.tmp")).unwrap();
    std::fs::write(tmp.join("f.1.2.tmp"), b"").unwrap();
    assert_eq!(remove_files_where(&fd, |_| true).unwrap(), 1);
    let mut left: Vec<_> = std::fs::read_dir(&tmp).unwrap().map(|e| e.unwrap().file_name()).collect();
    left.sort();
    assert_eq!(left, ["d.1.2.tmp", "l.1.2.tmp"]);
}

#[test]
fn a_cache_dir_of_another_uid_is_refused() {
    if !nix::unistd::geteuid().is_root() {
        panic!("this test chowns directories to other uids: run it as root (CI does)");
    }
    let base = tempfile::tempdir().unwrap();
    let root = base.path().join("cache");
    CacheRoot::open(&root).unwrap();
    let planted = plant(&root.join("v1/tmp"));
    let nobody = Some(nix::unistd::Uid::from_raw(65534));
    nix::unistd::chown(&root.join("v1/tmp"), nobody, None).unwrap();
    let (path, problem) = refusal(CacheRoot::open(&root));
    assert_eq!((path, problem), (root.join("v1/tmp"), Problem::Owner { owner: 65534, me: 0 }));
    assert!(planted.iter().all(|p| p.exists()));
    nix::unistd::chown(&root, nobody, None).unwrap();
    let (path, problem) = refusal(CacheRoot::open(&root));
    assert_eq!((path, problem), (root.clone(), Problem::Owner { owner: 65534, me: 0 }));
}
