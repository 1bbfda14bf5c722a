//! The last known roster on disk, so that a slot can start from it when the membership service
//! (etcd) cannot be reached at start; [`keep_saving`] keeps the file current as a roster changes. JSON, written to a temp file in the same directory, fsynced,
//! renamed into place (0600), then the directory fsynced: a reader sees the old file or the new
//! one, never a torn one, and several slots of a node may write the same path.
//!
//! ```json
//! {"format":"memarts-roster","version":1,
//!  "registered":[{"id":"n1","address":"10.0.0.1:7070","weight":1.0}],"alive":["n1"]}
//! ```

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::members::{Member, Roster};

const FORMAT: &str = "memarts-roster";
const VERSION: u32 = 1;

#[derive(Serialize, Deserialize)]
struct SnapshotFile {
    format: String,
    version: u32,
    registered: Vec<Member>,
    alive: Vec<String>,
}

/// Writes `roster` to `path` atomically (temp file, fsync, rename, directory fsync), mode 0600.
pub fn save_snapshot(roster: &Roster, path: &Path) -> io::Result<()> {
    static SERIAL: AtomicU64 = AtomicU64::new(0);
    let file = SnapshotFile {
        format: FORMAT.into(),
        version: VERSION,
        registered: roster.registered.clone(),
        alive: roster.alive.iter().cloned().collect(),
    };
    let body = serde_json::to_vec(&file).map_err(io::Error::other)?;
    let name = path.file_name().ok_or_else(|| {
        io::Error::new(io::ErrorKind::InvalidInput, format!("{}: not a file path", path.display()))
    })?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    // Unique per process and call, so that concurrent writers (the slots of one node) never share
    // a temp file.
    let serial = SERIAL.fetch_add(1, Ordering::Relaxed);
    let tmp = dir.join(format!(".{}.{}.{serial}.tmp", name.to_string_lossy(), std::process::id()));
    let written = (|| {
        let mut f = OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
        f.write_all(&body)?;
        f.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    written?;
    File::open(dir)?.sync_all()
}

/// Reads a roster written by [`save_snapshot`]. Members come back sorted by id (a repeated id keeps
/// its last entry), and only registered members count as alive.
pub fn load_snapshot(path: &Path) -> io::Result<Roster> {
    let invalid =
        |what: String| io::Error::new(io::ErrorKind::InvalidData, format!("{}: {what}", path.display()));
    let bytes = fs::read(path)?;
    let file: SnapshotFile =
        serde_json::from_slice(&bytes).map_err(|e| invalid(format!("not a roster snapshot: {e}")))?;
    if file.format != FORMAT || file.version != VERSION {
        return Err(invalid(format!(
            "format {:?} version {}, this build reads {FORMAT:?} version {VERSION}",
            file.format, file.version
        )));
    }
    let mut registered: Vec<Member> = Vec::with_capacity(file.registered.len());
    for m in file.registered {
        match registered.iter_mut().find(|r| r.id == m.id) {
            Some(r) => *r = m,
            None => registered.push(m),
        }
    }
    registered.sort_by(|a, b| a.id.cmp(&b.id));
    let alive = file.alive.into_iter().filter(|id| registered.iter().any(|m| &m.id == id)).collect();
    Ok(Roster { registered, alive })
}

/// Saves the roster `roster` follows to `path` now and after each change, on tokio's blocking pool,
/// until its sender is gone (the membership ended). A failed save is logged; the next change tries
/// again.
pub fn keep_saving(mut roster: watch::Receiver<Roster>, path: PathBuf) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let current = roster.borrow_and_update().clone();
            let target = path.clone();
            match tokio::task::spawn_blocking(move || save_snapshot(&current, &target)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::warn!(path = %path.display(), "could not save the roster snapshot: {e}")
                }
                Err(e) => tracing::warn!(path = %path.display(), "the roster snapshot save failed: {e}"),
            }
            if roster.changed().await.is_err() {
                return;
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn member(id: &str) -> Member {
        Member { id: id.into(), address: format!("127.0.0.1:{}", 7000 + id.len()), weight: 1.5 }
    }

    #[test]
    fn round_trip_is_exact_and_private() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("roster.json");
        let mut roster = Roster::all_alive(vec![member("b"), member("a"), member("ccc")]);
        roster.alive.remove("b");
        save_snapshot(&roster, &path).unwrap();
        assert_eq!(load_snapshot(&path).unwrap(), roster);
        assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        // Overwriting leaves no temp file behind.
        save_snapshot(&Roster::default(), &path).unwrap();
        assert_eq!(load_snapshot(&path).unwrap(), Roster::default());
        let names: Vec<_> = fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, vec![std::ffi::OsString::from("roster.json")]);
    }

    #[test]
    fn foreign_or_damaged_files_are_typed_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("roster.json");
        assert_eq!(load_snapshot(&path).unwrap_err().kind(), io::ErrorKind::NotFound);
        for body in [
            "{\"format\":\"memarts-roster\",\"ver",
            "{\"format\":\"other\",\"version\":1,\"registered\":[],\"alive\":[]}",
            "{\"format\":\"memarts-roster\",\"version\":2,\"registered\":[],\"alive\":[]}",
        ] {
            fs::write(&path, body).unwrap();
            let err = load_snapshot(&path).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{body}");
            assert!(err.to_string().contains("roster.json"), "{err}");
        }
    }

    #[test]
    fn loading_sorts_dedups_and_keeps_alive_within_registered() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("roster.json");
        fs::write(
            &path,
            r#"{"format":"memarts-roster","version":1,"alive":["z","a"],"registered":[
                {"id":"b","address":"h:1"},{"id":"a","address":"h:2"},{"id":"b","address":"h:3"}]}"#,
        )
        .unwrap();
        let roster = load_snapshot(&path).unwrap();
        let ids: Vec<_> = roster.registered.iter().map(|m| (m.id.as_str(), m.address.as_str())).collect();
        assert_eq!(ids, [("a", "h:2"), ("b", "h:3")]);
        assert_eq!(roster.registered[0].weight, 1.0);
        assert_eq!(roster.alive.into_iter().collect::<Vec<_>>(), ["a"]);
    }

    #[tokio::test]
    async fn keep_saving_follows_the_roster_until_its_sender_goes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("roster.json");
        let (tx, rx) = watch::channel(Roster::all_alive(vec![member("a")]));
        let saver = keep_saving(rx, path.clone());
        let wait_for = |want: Roster| {
            let path = path.clone();
            async move {
                for _ in 0..200 {
                    if load_snapshot(&path).ok().as_ref() == Some(&want) {
                        return;
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
                panic!("snapshot is {:?}, not {want:?}", load_snapshot(&path));
            }
        };
        wait_for(Roster::all_alive(vec![member("a")])).await;
        tx.send_replace(Roster::all_alive(vec![member("a"), member("bb")]));
        wait_for(Roster::all_alive(vec![member("a"), member("bb")])).await;
        drop(tx);
        tokio::time::timeout(std::time::Duration::from_secs(5), saver).await.unwrap().unwrap();
    }
}
