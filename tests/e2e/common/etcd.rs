//! A real etcd server on loopback for the cluster tests (Debian's `etcd-server`; `make deps-test`
//! installs it): free ports, a private data dir, killed when dropped; restartable on the same data
//! dir, as an operator's etcd would come back. If the binary is missing, the test fails loudly.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Etcd {
    pub dir: tempfile::TempDir,
    pub client_port: u16,
    peer_port: u16,
    child: Option<Child>,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("free port").port()
}

impl Etcd {
    pub fn start() -> Etcd {
        let mut etcd = Etcd {
            dir: tempfile::tempdir().unwrap(),
            client_port: free_port(),
            peer_port: free_port(),
            child: None,
        };
        etcd.spawn();
        etcd
    }

    /// `http://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    /// Starts the server (again) and waits until it takes connections.
    pub fn spawn(&mut self) {
        let bin = std::env::var("MEMARTS_ETCD").unwrap_or_else(|_| "etcd".into());
        let (client, peer) = (self.endpoint(), format!("http://127.0.0.1:{}", self.peer_port));
        let mut cmd = Command::new(&bin);
        cmd.arg("--data-dir")
            .arg(self.dir.path().join("data"))
            .args(["--name", "default", "--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("default={peer}")])
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: prctl is async-signal-safe and only affects the child being set up.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = cmd.spawn().unwrap_or_else(|e| {
            panic!("cannot start {bin} ({e}): the etcd tests need etcd (apt-get install etcd-server; `make deps-test` does)")
        });
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", self.client_port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "etcd did not listen on port {} within 20 s",
                self.client_port
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        // Serving once a key can be written.
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self.etcdctl(&["put", "/memarts-test/ready", "1"]) {
            assert!(Instant::now() < deadline, "etcd did not serve within 20 s");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Runs `etcdctl` against this server; whether it succeeded.
    pub fn etcdctl(&self, args: &[&str]) -> bool {
        Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", self.endpoint()))
            .args(args)
            .output()
            .is_ok_and(|o| o.status.success())
    }

    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.kill();
    }
}
