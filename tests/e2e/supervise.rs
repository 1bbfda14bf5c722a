//! `memarts start_proxy N --foreground` (issue 16), the supervisor that systemd
//! (`ops/systemd/memarts.service`, `Type=notify`) and Kubernetes (`ops/kubernetes/`, PID 1) run: it
//! tells the service manager when the fleet is ready, starts again a slot that dies, stops every
//! slot when `memarts stop_proxy` or SIGTERM asks, and gives up (exits with failure, the fleet
//! stopped) on a slot that keeps dying, for the service manager to start everything again.

use std::io::Read;
use std::os::unix::net::UnixDatagram;
use std::process::{Child, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::common::{pattern, text, Fleet};

const CS: u64 = 64 << 10;

/// The supervisor of a 2-slot fleet, and the socket it notifies (as systemd's `$NOTIFY_SOCKET`).
fn supervise(fleet: &Fleet) -> (Child, UnixDatagram) {
    let path = fleet.dir.path().join("notify.sock");
    let _ = std::fs::remove_file(&path); // a previous supervisor's
    let notify = UnixDatagram::bind(&path).unwrap();
    notify.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let child = fleet
        .command(&["start_proxy", "2", "--foreground", "--grace", "5"])
        .env("NOTIFY_SOCKET", &path)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the supervisor");
    (child, notify)
}

/// The next notification whose text contains `want`.
fn notified(notify: &UnixDatagram, want: &str) -> String {
    let mut buf = [0u8; 4096];
    loop {
        let n = notify.recv(&mut buf).unwrap_or_else(|e| panic!("no notification with {want:?}: {e}"));
        let got = String::from_utf8_lossy(&buf[..n]).into_owned();
        if got.contains(want) {
            return got;
        }
    }
}

fn exited(child: &mut Child, within: Duration) -> ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(Instant::now() < deadline, "the supervisor did not exit within {within:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn stderr_of(child: &mut Child) -> String {
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    err
}

/// Nothing of the fleet is left: no slot's socket or pid file, no supervisor's pid file.
fn assert_clean(fleet: &Fleet) {
    let left: Vec<String> = std::fs::read_dir(&fleet.run_dir)
        .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    let stray: Vec<&String> =
        left.iter().filter(|n| n.ends_with(".sock") || n.ends_with(".pid") || *n == "fleet.json").collect();
    assert!(stray.is_empty(), "left behind in the run dir: {stray:?}");
}

#[test]
fn the_supervisor_says_ready_starts_a_dead_slot_again_and_stop_proxy_stops_it() {
    let fleet = Fleet::new(&[]);
    let data = pattern(77, 3 * CS as usize + 5);
    let file = fleet.dir.path().join("data.bin");
    std::fs::write(&file, &data).unwrap();
    let url = file.display().to_string();
    let (mut supervisor, notify) = supervise(&fleet);
    let ready = notified(&notify, "READY=1");
    assert!(ready.contains(&format!("MAINPID={}", supervisor.id())), "{ready}");
    assert!(fleet.memarts(&["status"]).status.success(), "not every slot answers once READY=1 was sent");
    assert_eq!(fleet.status()["supervisor"], supervisor.id(), "status does not name the supervisor");
    assert!(fleet.client(CS).read(&url).unwrap() == data);

    let old = fleet.pid(1);
    kill(Pid::from_raw(old), Signal::SIGKILL).unwrap();
    notified(&notify, "slot 1 started again");
    assert_ne!(fleet.pid(1), old);
    assert!(fleet.memarts(&["status"]).status.success(), "slot 1 is not back");
    assert!(fleet.client(CS).read(&url).unwrap() == data);

    // stop_proxy asks the supervisor, which stops the slots and exits, instead of racing it.
    let out = fleet.stop_proxy();
    assert!(text(&out.stdout).contains("asking the supervisor"), "{}", text(&out.stdout));
    notified(&notify, "STOPPING=1");
    let status = exited(&mut supervisor, Duration::from_secs(30));
    assert!(status.success(), "the supervisor exited with {status}: {}", stderr_of(&mut supervisor));
    assert_clean(&fleet);
    fleet.start_proxy(1);
    assert!(fleet.status()["supervisor"].is_null(), "a fleet without a supervisor shows one");
}

#[test]
fn sigterm_stops_the_supervised_fleet_and_a_slot_that_keeps_dying_fails_the_supervisor() {
    let fleet = Fleet::new(&[]);
    let (mut supervisor, notify) = supervise(&fleet);
    notified(&notify, "READY=1");
    kill(Pid::from_raw(supervisor.id() as i32), Signal::SIGTERM).unwrap();
    let status = exited(&mut supervisor, Duration::from_secs(30));
    assert!(status.success(), "SIGTERM: the supervisor exited with {status}: {}", stderr_of(&mut supervisor));
    assert_clean(&fleet);

    // Five restarts of one slot within a minute are allowed; the sixth death is a fault a restart
    // does not fix.
    let (mut supervisor, notify) = supervise(&fleet);
    notified(&notify, "READY=1");
    for _ in 0..5 {
        kill(Pid::from_raw(fleet.pid(0)), Signal::SIGKILL).unwrap();
        notified(&notify, "slot 0 started again");
    }
    kill(Pid::from_raw(fleet.pid(0)), Signal::SIGKILL).unwrap();
    let status = exited(&mut supervisor, Duration::from_secs(30));
    let err = stderr_of(&mut supervisor);
    assert!(!status.success(), "a slot that keeps dying did not fail the supervisor: {err}");
    assert!(err.contains("slot 0 died 6 times"), "{err}");
    assert_clean(&fleet);
}
