//! I5 on a real fleet: `kill -9` of every slot while chunk fills are being written leaves each chunk
//! whole or absent; what the dead slots left in `v1/tmp` is never served and is gone once the fleet
//! is started again.

use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::common::files::files_below;
use crate::common::{moto, pattern, Fleet};

const CS: u64 = 1 << 20;

#[test]
fn kill_9_during_fills_leaves_whole_chunks_or_nothing_and_leftovers_go_at_the_next_start() {
    let bucket = moto().bucket("crash-fill");
    let objects: Arc<Vec<Vec<u8>>> = Arc::new((0..4).map(|i| pattern(4400 + i, 8 * CS as usize)).collect());
    for (i, o) in objects.iter().enumerate() {
        moto().put(&bucket, &format!("o{i}"), o);
    }
    let fleet = Fleet::start(2, &[]);
    // Warm one object, then crash the fleet in the middle of cold reads of the others.
    let client = fleet.client(CS);
    assert!(client.read(&format!("s3://{bucket}/o0")).unwrap() == objects[0]);
    fleet.wait_cached(8);
    let o0_files = files_below(&fleet.cache_dir.join("v1/chunks"));
    assert_eq!(o0_files.len(), 8);
    let readers: Vec<_> = (1..4)
        .map(|i| {
            let short = memarts_shim::Client::new(memarts_shim::ShimConfig {
                deadline: Duration::from_secs(1),
                ..client.config().clone()
            })
            .unwrap();
            let url = format!("s3://{bucket}/o{i}");
            std::thread::spawn(move || drop(short.read(&url)))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(150));
    for slot in 0..2 {
        kill(Pid::from_raw(fleet.pid(slot)), Signal::SIGKILL).unwrap();
    }
    for r in readers {
        r.join().unwrap();
    }

    // What a crash mid-write looks like, for sure: whole chunk files of o0 moved back into v1/tmp
    // under the name of a writer that is gone, their real files removed.
    let mut gone = std::process::Command::new("true").spawn().unwrap();
    let dead = gone.id();
    gone.wait().unwrap();
    let tmp = fleet.cache_dir.join("v1/tmp");
    let mut moved = 0;
    for (i, f) in o0_files.iter().take(3).enumerate() {
        let id = f.file_name().unwrap().to_string_lossy().into_owned();
        std::fs::rename(f, tmp.join(format!("{id}.{dead}.{i}.tmp"))).unwrap();
        moved += 1;
    }
    let leftovers = files_below(&tmp);
    assert!(leftovers.len() >= moved, "{leftovers:?}");

    fleet.stop_proxy();
    fleet.start_proxy(2);
    assert!(
        files_below(&tmp).iter().all(|f| !leftovers.contains(f)),
        "leftovers outlived the restart: {:?}",
        files_below(&tmp)
    );
    for (i, o) in objects.iter().enumerate() {
        assert!(client.read(&format!("s3://{bucket}/o{i}")).unwrap() == *o, "o{i} differs after the crash");
    }
    assert_eq!(fleet.total("corrupt_chunks"), 0, "the crash left a torn chunk file where a reader found it");
    // The chunks whose only copy was a leftover temp file were fetched again, not served from it.
    moto().gets_settled(&bucket);
    let o0_gets = moto().requests(&format!("GET /{bucket}/o0"));
    assert_eq!(o0_gets, 8 + moved, "o0: its first 8 GETs, then one per chunk whose file was a leftover");
}
