//! Tests of the etcd membership against a real `etcd` server (Debian's `etcd-server`; another binary
//! with `MEMARTS_ETCD`), one per test on free loopback ports with its own data dir, killed when the
//! test ends. Without an etcd binary these tests fail, saying so; they never skip.

use std::fs::File;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use etcd_client::{Client, GetOptions, PutOptions};
use tokio::sync::watch;

use super::{load_snapshot, EtcdError, EtcdMembership, Member, Roster};

const TTL: Duration = Duration::from_secs(2);
const CONNECT: Duration = Duration::from_secs(3);

/// A real etcd on 127.0.0.1, started by [`Etcd::start`], killed on drop.
struct Etcd {
    child: Option<Child>,
    dir: tempfile::TempDir,
    client_port: u16,
    peer_port: u16,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port()
}

impl Etcd {
    async fn start() -> Etcd {
        let dir = tempfile::tempdir().expect("a temp dir");
        let mut etcd = Etcd { child: None, dir, client_port: free_port(), peer_port: free_port() };
        etcd.spawn().await;
        etcd
    }

    /// Starts the server (again, on the same ports and data dir) and waits until it answers.
    async fn spawn(&mut self) {
        let bin = std::env::var_os("MEMARTS_ETCD").unwrap_or_else(|| "etcd".into());
        let client = format!("http://127.0.0.1:{}", self.client_port);
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let log = File::options().create(true).append(true).open(self.log_path()).expect("etcd log file");
        let mut cmd = Command::new(&bin);
        cmd.arg("--data-dir")
            .arg(self.dir.path().join("data"))
            .args(["--name", "default", "--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("default={peer}")])
            // Faster elections; the minimum lease TTL follows (1 s), so TTL is granted as asked.
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("etcd log file"))
            .stderr(log);
        // SAFETY: prctl is async-signal-safe and only changes the child being set up. The signal
        // comes when the spawning thread ends: the test's own thread, which outlives the guard.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = cmd.spawn().unwrap_or_else(|e| {
            panic!(
                "cannot run {bin:?} ({e}): the etcd membership tests need a real etcd 3.4+ server: \
                 apt-get install etcd-server, or set MEMARTS_ETCD to its path"
            )
        });
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let answered = tokio::time::timeout(Duration::from_millis(500), async {
                Client::connect(self.endpoints(), None).await?.status().await
            })
            .await;
            if let Ok(Ok(_)) = answered {
                return;
            }
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                panic!("etcd exited ({status}) before answering:\n{}", self.log_tail());
            }
            assert!(Instant::now() < deadline, "etcd did not answer within 15 s:\n{}", self.log_tail());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn endpoints(&self) -> Vec<String> {
        vec![format!("127.0.0.1:{}", self.client_port)]
    }

    async fn client(&self) -> Client {
        Client::connect(self.endpoints(), None).await.expect("a client of the test etcd")
    }

    fn log_path(&self) -> std::path::PathBuf {
        self.dir.path().join("etcd.log")
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.kill();
    }
}

fn member(id: &str, port: u16) -> Member {
    Member { id: id.into(), address: format!("127.0.0.1:{port}"), weight: 1.0 }
}

async fn join(etcd: &Etcd, id: &str, slot: u32) -> EtcdMembership {
    EtcdMembership::join(&etcd.endpoints(), "job", &member(id, 7000), slot, TTL, CONNECT)
        .await
        .unwrap_or_else(|e| panic!("{id}/{slot} joins: {e}"))
}

fn registered(r: &Roster) -> Vec<&str> {
    r.registered.iter().map(|m| m.id.as_str()).collect()
}

fn alive(r: &Roster) -> Vec<&str> {
    r.alive.iter().map(|s| s.as_str()).collect()
}

/// Waits until the roster satisfies `ok`; fails with the last roster after `within`.
async fn until(rx: &mut watch::Receiver<Roster>, what: &str, within: Duration, ok: impl Fn(&Roster) -> bool) {
    let met = matches!(tokio::time::timeout(within, rx.wait_for(|r| ok(r))).await, Ok(Ok(_)));
    assert!(met, "{what}: not within {within:?}; roster {:?}", *rx.borrow());
}

/// The lease id of `key` in etcd (0: no lease), or `None` if the key does not exist.
async fn lease_of(client: &mut Client, key: &str) -> Option<i64> {
    client.get(key, None).await.expect("get").kvs().first().map(|kv| kv.lease())
}

#[tokio::test]
async fn two_nodes_join_and_see_each_other() {
    let etcd = Etcd::start().await;
    let a = join(&etcd, "a", 0).await;
    let b0 = join(&etcd, "b", 0).await;
    let _b1 = join(&etcd, "b", 1).await;
    for (who, m) in [("a", &a), ("b", &b0)] {
        until(&mut m.roster(), who, Duration::from_secs(5), |r| {
            registered(r) == ["a", "b"] && alive(r) == ["a", "b"]
        })
        .await;
    }
    assert_eq!(*a.roster().borrow().member("b").unwrap(), member("b", 7000));
    let mut client = etcd.client().await;
    assert_eq!(
        lease_of(&mut client, "/memarts/job/registered/a").await,
        Some(0),
        "registration has no lease"
    );
    for slot in ["a/0", "b/0", "b/1"] {
        let lease = lease_of(&mut client, &format!("/memarts/job/alive/{slot}")).await;
        assert!(lease.is_some_and(|l| l != 0), "alive/{slot} is leased: {lease:?}");
    }
}

#[tokio::test]
async fn slots_that_leave_or_lose_their_lease_stay_registered() {
    let etcd = Etcd::start().await;
    let observer = join(&etcd, "o", 0).await;
    let a0 = join(&etcd, "a", 0).await;
    let a1 = join(&etcd, "a", 1).await;
    let b = join(&etcd, "b", 0).await;
    let mut rx = observer.roster();
    until(&mut rx, "all alive", Duration::from_secs(5), |r| alive(r) == ["a", "b", "o"]).await;

    // One slot of a leaves: a is still up by its other slot.
    a0.leave().await;
    let mut client = etcd.client().await;
    assert_eq!(lease_of(&mut client, "/memarts/job/alive/a/0").await, None, "leave revokes at once");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(alive(&rx.borrow()), ["a", "b", "o"]);
    a1.leave().await;
    until(&mut rx, "a down", Duration::from_secs(3), |r| alive(r) == ["b", "o"]).await;

    // b stops renewing (its task dies as with its process): down once the lease runs out.
    let started = Instant::now();
    drop(b);
    assert!(lease_of(&mut client, "/memarts/job/alive/b/0").await.is_some(), "a drop does not revoke");
    until(&mut rx, "b's lease expired", TTL + Duration::from_secs(3), |r| alive(r) == ["o"]).await;
    assert!(
        started.elapsed() >= TTL / 2,
        "b went down after {:?}, before its lease ran out",
        started.elapsed()
    );
    assert_eq!(registered(&rx.borrow()), ["a", "b", "o"], "leaving moves no ownership");
}

#[tokio::test]
async fn a_node_joining_later_appears_and_a_new_address_replaces_the_old() {
    let etcd = Etcd::start().await;
    let a = join(&etcd, "a", 0).await;
    let mut rx = a.roster();
    assert_eq!((registered(&rx.borrow()), alive(&rx.borrow())), (vec!["a"], vec!["a"]));
    let b = join(&etcd, "b", 0).await;
    until(&mut rx, "b appears", Duration::from_secs(3), |r| alive(r) == ["a", "b"]).await;
    b.leave().await;
    until(&mut rx, "b left", Duration::from_secs(3), |r| alive(r) == ["a"]).await;
    let moved = member("b", 7100);
    let _b = EtcdMembership::join(&etcd.endpoints(), "job", &moved, 0, TTL, CONNECT).await.unwrap();
    until(&mut rx, "b back at its new address", Duration::from_secs(3), |r| {
        alive(r) == ["a", "b"] && r.member("b") == Some(&moved)
    })
    .await;
}

#[tokio::test]
async fn an_etcd_restart_keeps_the_roster_and_brings_the_alive_keys_back() {
    let mut etcd = Etcd::start().await;
    let a = join(&etcd, "a", 0).await;
    let _b = join(&etcd, "b", 0).await;
    let mut rx = a.roster();
    until(&mut rx, "both alive", Duration::from_secs(5), |r| alive(r) == ["a", "b"]).await;
    let mut client = etcd.client().await;
    let lease_before = lease_of(&mut client, "/memarts/job/alive/a/0").await.unwrap();
    let before = rx.borrow_and_update().clone();

    // Down for longer than the TTL: nobody is declared down, nothing changes.
    etcd.kill();
    tokio::time::sleep(TTL + Duration::from_secs(1)).await;
    assert!(!rx.has_changed().unwrap(), "the roster changed while etcd was down: {:?}", *rx.borrow());
    assert_eq!(*rx.borrow(), before);

    etcd.spawn().await;
    let mut client = etcd.client().await;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (la, lb) = (
            lease_of(&mut client, "/memarts/job/alive/a/0").await,
            lease_of(&mut client, "/memarts/job/alive/b/0").await,
        );
        // A new lease on a's key says a reconnected (and did not merely outlive the outage).
        if la.is_some_and(|l| l != lease_before) && lb.is_some() {
            break;
        }
        assert!(Instant::now() < deadline, "alive keys not back after the restart: a {la:?} b {lb:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Renewed, not just left over: still there after more than a TTL.
    tokio::time::sleep(TTL + Duration::from_millis(500)).await;
    for key in ["/memarts/job/alive/a/0", "/memarts/job/alive/b/0"] {
        assert!(lease_of(&mut client, key).await.is_some(), "{key} expired after the restart");
    }
    // The watch is back too: a node joining now shows up.
    let _c = join(&etcd, "c", 0).await;
    until(&mut rx, "c seen after the restart", Duration::from_secs(3), |r| alive(r) == ["a", "b", "c"]).await;
}

#[tokio::test]
async fn a_lease_lost_under_a_live_membership_is_granted_again() {
    let etcd = Etcd::start().await;
    let a = join(&etcd, "a", 0).await;
    let mut client = etcd.client().await;
    let key = "/memarts/job/alive/a/0";
    let lease = lease_of(&mut client, key).await.unwrap();
    client.lease_revoke(lease).await.unwrap();
    assert_eq!(lease_of(&mut client, key).await, None);
    let deadline = Instant::now() + TTL + Duration::from_secs(3);
    while !lease_of(&mut client, key).await.is_some_and(|l| l != lease && l != 0) {
        assert!(Instant::now() < deadline, "the alive key did not come back on a new lease");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    until(&mut a.roster(), "a alive again", Duration::from_secs(3), |r| alive(r) == ["a"]).await;
}

#[tokio::test]
async fn what_etcd_holds_that_is_not_a_member_is_skipped() {
    let etcd = Etcd::start().await;
    let mut client = etcd.client().await;
    for (key, value) in [
        ("/memarts/job/registered/x", "{not json"),
        ("/memarts/job/registered/y", r#"{"id":"someone-else","address":"h:1"}"#),
        ("/memarts/job/alive/x/not-a-slot", ""),
        ("/memarts/job/stray", "?"),
    ] {
        client.put(key, value, None).await.unwrap();
    }
    let a = join(&etcd, "a", 0).await;
    let mut rx = a.roster();
    assert_eq!((registered(&rx.borrow()), alive(&rx.borrow())), (vec!["a"], vec!["a"]));
    // More garbage while watching, then a good member written by hand: the watch goes on.
    client.put("/memarts/job/registered/x", "[]", None).await.unwrap();
    let lease = client.lease_grant(5, None).await.unwrap().id();
    client
        .put("/memarts/job/registered/z", serde_json::to_vec(&member("z", 1)).unwrap(), None)
        .await
        .unwrap();
    client.put("/memarts/job/alive/z/0", "", Some(PutOptions::new().with_lease(lease))).await.unwrap();
    until(&mut rx, "z seen past the garbage", Duration::from_secs(3), |r| {
        registered(r) == ["a", "z"] && alive(r) == ["a", "z"]
    })
    .await;
    let all = client.get("/memarts/job/", Some(GetOptions::new().with_prefix())).await.unwrap();
    assert_eq!(all.kvs().len(), 8, "nothing of the garbage was removed");
}

#[tokio::test]
async fn the_snapshot_follows_the_roster_and_serves_a_start_while_etcd_is_down() {
    let mut etcd = Etcd::start().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("roster.json");
    let a = join(&etcd, "a", 0).await;
    a.save_snapshots_to(&path);
    let _b = join(&etcd, "b", 0).await;
    let mut rx = a.roster();
    until(&mut rx, "b seen", Duration::from_secs(3), |r| alive(r) == ["a", "b"]).await;
    let deadline = Instant::now() + Duration::from_secs(3);
    while load_snapshot(&path).ok().as_ref() != Some(&*rx.borrow()) {
        assert!(Instant::now() < deadline, "snapshot not updated: {:?}", load_snapshot(&path));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A slot (re)starting while etcd is away: join fails, typed; it starts from the snapshot.
    etcd.kill();
    let timeout = Duration::from_millis(500);
    let err = EtcdMembership::join(&etcd.endpoints(), "job", &member("c", 1), 0, TTL, timeout)
        .await
        .expect_err("etcd is down");
    assert!(err.retryable(), "{err}");
    assert_eq!(load_snapshot(&path).unwrap(), *rx.borrow());
    assert_eq!(registered(&load_snapshot(&path).unwrap()), ["a", "b"]);
}

/// Nothing listens (refused), or something listens and never answers (a hung etcd or a firewall
/// that drops): both fail within the connect timeout, typed and retryable.
#[tokio::test]
async fn joining_with_etcd_down_fails_within_the_connect_timeout() {
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_endpoint = silent.local_addr().unwrap().to_string();
    for endpoint in [format!("127.0.0.1:{}", free_port()), silent_endpoint] {
        let timeout = Duration::from_secs(1);
        let started = Instant::now();
        let joined =
            EtcdMembership::join(std::slice::from_ref(&endpoint), "job", &member("a", 1), 0, TTL, timeout)
                .await;
        let took = started.elapsed();
        let err = joined.err().unwrap_or_else(|| panic!("joined with nothing at {endpoint}"));
        assert!(matches!(err, EtcdError::Unreachable { .. }) && err.retryable(), "{endpoint}: {err:?}");
        assert!(err.to_string().contains(&endpoint), "{err}");
        assert!(took >= timeout && took < timeout + Duration::from_millis(500), "{endpoint}: took {took:?}");
    }
}

#[tokio::test]
async fn bad_arguments_are_refused_before_any_connection() {
    let some = vec!["127.0.0.1:1".to_string()];
    let join = |endpoints: Vec<String>, name: &'static str, me: Member| async move {
        EtcdMembership::join(&endpoints, name, &me, 0, TTL, CONNECT).await.expect_err("refused")
    };
    assert!(matches!(join(vec![], "job", member("a", 1)).await, EtcdError::NoEndpoints));
    for (name, id) in [("", "a"), ("a/b", "a"), ("job", ""), ("job", "n/1")] {
        let err = join(some.clone(), name, member(id, 1)).await;
        assert!(matches!(err, EtcdError::InvalidName { .. }) && !err.retryable(), "{name:?} {id:?}: {err:?}");
    }
    let heavy = Member { weight: f64::NAN, ..member("a", 1) };
    assert!(matches!(join(some, "job", heavy).await, EtcdError::InvalidWeight { .. }));
    let err = join(vec!["http://[::1".into()], "job", member("a", 1)).await;
    assert!(matches!(err, EtcdError::BadEndpoint { .. }), "{err:?}");
    assert!(err.to_string().contains("http://[::1"), "{err}");
}
