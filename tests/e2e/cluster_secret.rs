//! S6 and issue 28: the cluster secret file is what makes a node a member of the pool, so
//! `memarts start_proxy --cluster` refuses one that another user can read or write, one of another
//! uid (who could have written it), and one too weak to hold 256 bits of entropy, each with one
//! error naming the file and the fix; no slot starts.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::common::cluster::Cluster;
use crate::common::raw::OTHER_UID;
use crate::common::text;

/// `start_proxy 1` of the cluster's first node, which must fail with no slot started; its error.
fn start_refused(cluster: &Cluster) -> String {
    let node = &cluster.nodes[0];
    let out = node.memarts(&["start_proxy", "1"]);
    let err = text(&out.stderr);
    assert!(!out.status.success(), "start_proxy went ahead:\n{}{err}", text(&out.stdout));
    assert!(!node.run_dir.join("proxy-0.sock").exists(), "a slot started");
    err
}

fn write_secret(path: &Path, body: &[u8], mode: u32) {
    std::fs::write(path, body).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

#[test]
fn start_proxy_refuses_a_secret_file_others_can_read_or_write_or_that_is_not_ours() {
    let cluster = Cluster::new(2, 1, "", &[]);
    let secret = cluster.dir.path().join("cluster.secret");
    let name = secret.display().to_string();
    let good = std::fs::read(&secret).unwrap();
    for (mode, what) in [
        (0o640, "readable by other users (mode 0640)"),
        (0o604, "readable by other users (mode 0604)"),
        (0o620, "writable by other users (mode 0620)"),
        (0o602, "writable by other users (mode 0602)"),
    ] {
        write_secret(&secret, &good, mode);
        let err = start_refused(&cluster);
        for part in [name.as_str(), what, &format!("chmod 600 {name}")] {
            assert!(err.contains(part), "mode {mode:04o}: {part:?} missing from: {err}");
        }
        assert_eq!(err.matches(&name).count(), 2, "one error, naming the file and its fix: {err}");
    }
    write_secret(&secret, &good, 0o600);
    let other = Some(nix::unistd::Uid::from_raw(OTHER_UID));
    nix::unistd::chown(&secret, other, None).unwrap();
    let err = start_refused(&cluster);
    for part in [name.as_str(), "belongs to uid 65534", "chown"] {
        assert!(err.contains(part), "{part:?} missing from: {err}");
    }
    // Ours again: the same file starts the node.
    nix::unistd::chown(&secret, Some(nix::unistd::geteuid()), None).unwrap();
    cluster.start_node(0);
}

#[test]
fn start_proxy_refuses_a_secret_file_with_less_than_256_bits_of_entropy() {
    let cluster = Cluster::new(2, 1, "", &[]);
    let secret = cluster.dir.path().join("cluster.secret");
    let name = secret.display().to_string();
    let weak: [(&[u8], &str); 4] = [
        // What the e2e helper used to write: 128 bits.
        (b"0123456789abcdef0123456789abcdef\n", "about 128 bits of entropy (32 hex digits"),
        (b"correct horse battery staple\n", "printable ASCII characters"),
        // 24 random bytes in base64: 192 bits.
        (b"c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0\n", "about 192 bits of entropy (32 base64 characters"),
        (&[0xff; 31], "about 248 bits of entropy (31 bytes"),
    ];
    for (body, what) in weak {
        write_secret(&secret, body, 0o600);
        let err = start_refused(&cluster);
        let fix = format!("head -c 32 /dev/urandom | base64 > {name} && chmod 600 {name}");
        for part in [name.as_str(), what, "fewer than the 256", &fix] {
            assert!(err.contains(part), "{part:?} missing from: {err}");
        }
    }
    // What docs/CLUSTER.md's command makes: 32 random bytes in base64, 258 bits.
    let strong = format!("{}=\n", "Zm9vYmFyYmF6cXV4".repeat(2) + "Zm9vYmFyYmF");
    assert_eq!(strong.trim().len(), 44);
    write_secret(&secret, strong.as_bytes(), 0o600);
    cluster.start_node(0);
}
