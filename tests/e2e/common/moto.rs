//! A real S3-protocol server on loopback: moto (`pip install 'moto[server]'`), one per test binary,
//! with its request log parsed to count origin GETs per bucket. If moto cannot start, every test that
//! needs it fails loudly with the reason.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path;
use object_store::{ObjectStore, PutPayload};

pub struct Moto {
    pub endpoint: String,
    /// Every request line moto logged, e.g. `GET /bucket/key HTTP/1.1" 206`.
    log: Arc<Mutex<Vec<String>>>,
    rt: tokio::runtime::Runtime,
}

static MOTO: OnceLock<Result<Moto, String>> = OnceLock::new();

/// The shared server; panics with the reason if it cannot start.
pub fn moto() -> &'static Moto {
    match MOTO.get_or_init(start) {
        Ok(m) => m,
        Err(e) => panic!("cannot start the moto S3 server the end-to-end tests need: {e}"),
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("free port").port()
}

fn start() -> Result<Moto, String> {
    let port = free_port();
    let log = Arc::new(Mutex::new(Vec::new()));
    let (tx, rx) = std::sync::mpsc::channel();
    let log2 = log.clone();
    // The server is spawned from a thread that never ends, so PR_SET_PDEATHSIG (tied to the spawning
    // thread) fires only when the whole test process exits.
    std::thread::spawn(move || {
        let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
        let mut cmd = Command::new(python);
        cmd.args(["-m", "moto.server", "-H", "127.0.0.1", "-p", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        // SAFETY: prctl is async-signal-safe and only affects the child being set up.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                let _ = tx.send(Err(format!("python3 -m moto.server: {e}")));
                return;
            }
        };
        let stderr = child.stderr.take().expect("piped");
        let _ = tx.send(Ok(()));
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(req) = line.split('"').nth(1) {
                log2.lock()
                    .unwrap()
                    .push(format!("{req}\" {}", line.rsplit('"').next().unwrap_or("").trim()));
            } else {
                log2.lock().unwrap().push(line);
            }
        }
        let status = child.wait();
        log2.lock().unwrap().push(format!("moto exited: {status:?}"));
        loop {
            std::thread::park();
        }
    });
    rx.recv().map_err(|e| e.to_string())??;
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            let tail = log.lock().unwrap().iter().rev().take(20).cloned().collect::<Vec<_>>().join("\n");
            return Err(format!(
                "moto did not listen on port {port} within 60s (is moto[server] installed?)\n{tail}"
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    Ok(Moto { endpoint: format!("http://127.0.0.1:{port}"), log, rt })
}

impl Moto {
    /// Environment for proxies and direct clients to reach this server.
    pub fn env(&self) -> Vec<(String, String)> {
        [
            ("AWS_ENDPOINT_URL", self.endpoint.as_str()),
            ("AWS_ALLOW_HTTP", "true"),
            ("AWS_ACCESS_KEY_ID", "testing"),
            ("AWS_SECRET_ACCESS_KEY", "testing"),
            ("AWS_REGION", "us-east-1"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    }

    fn store(&self, bucket: &str) -> AmazonS3 {
        AmazonS3Builder::new()
            .with_endpoint(&self.endpoint)
            .with_allow_http(true)
            .with_bucket_name(bucket)
            .with_region("us-east-1")
            .with_access_key_id("testing")
            .with_secret_access_key("testing")
            .build()
            .expect("s3 client")
    }

    /// Creates a fresh bucket with a unique name.
    pub fn bucket(&self, hint: &str) -> String {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let name = format!("{hint}-{}-{n}", std::process::id()).to_lowercase().replace('_', "-");
        assert!(http_put(&format!("{}/{name}", self.endpoint)), "creating bucket {name}");
        name
    }

    pub fn put(&self, bucket: &str, key: &str, data: &[u8]) {
        let store = self.store(bucket);
        let payload = PutPayload::from(data.to_vec());
        self.rt.block_on(store.put(&Path::from(key), payload)).expect("put object");
    }

    /// Puts many objects, 16 at a time (a thousand one after the other take half a minute).
    pub fn put_many(&self, bucket: &str, objects: impl IntoIterator<Item = (String, Vec<u8>)>) {
        use futures::stream::{self, StreamExt, TryStreamExt};
        let store = self.store(bucket);
        let puts = stream::iter(objects)
            .map(|(key, data)| {
                let store = &store;
                async move { store.put(&Path::from(key), PutPayload::from(data)).await }
            })
            .buffer_unordered(16)
            .try_collect::<Vec<_>>();
        self.rt.block_on(puts).expect("put objects");
    }

    /// GET requests moto has seen for `bucket` so far.
    pub fn gets(&self, bucket: &str) -> usize {
        self.requests(&format!("GET /{bucket}/"))
    }

    /// Logged requests whose line starts with `prefix`, e.g. `HEAD /bucket/key`.
    pub fn requests(&self, prefix: &str) -> usize {
        self.log.lock().unwrap().iter().filter(|l| l.starts_with(prefix)).count()
    }

    /// Waits until moto's log has caught up (it is read by a thread) and returns the GET count.
    pub fn gets_settled(&self, bucket: &str) -> usize {
        let mut last = self.gets(bucket);
        loop {
            std::thread::sleep(Duration::from_millis(150));
            let now = self.gets(bucket);
            if now == last {
                return now;
            }
            last = now;
        }
    }
}

/// `PUT /bucket` (moto does not check signatures for it).
fn http_put(url: &str) -> bool {
    let addr = url.trim_start_matches("http://");
    let (host, path) = addr.split_once('/').unwrap();
    let req =
        format!("PUT /{path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    let Ok(mut s) = std::net::TcpStream::connect(host) else { return false };
    use std::io::{Read, Write};
    if s.write_all(req.as_bytes()).is_err() {
        return false;
    }
    let mut resp = String::new();
    let _ = s.read_to_string(&mut resp);
    resp.starts_with("HTTP/1.1 200") || resp.starts_with("HTTP/1.0 200")
}

pub fn target_dir() -> PathBuf {
    // tests run from target/<profile>/deps/e2e-<hash>
    let exe = std::env::current_exe().expect("current exe");
    exe.parent().and_then(|p| p.parent()).expect("target profile dir").to_path_buf()
}
