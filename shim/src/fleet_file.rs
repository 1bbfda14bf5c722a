//! What a client reads of `<run dir>/fleet.json`: the fleet's config, which the proxy's
//! `FleetConfig::write_fleet_file` writes and its slots read whole. A client needs only a few of its
//! fields, read here and nowhere else (the CLI and the Python package take them from this type);
//! `tests/src/lib.rs` keeps them in step with what a started fleet writes.

use std::path::{Path, PathBuf};

use memarts_disk::layout::fleet_file;
use serde::Deserialize;

use crate::error::{Error, Result};

/// The fields of `fleet.json` a client uses.
#[derive(Debug, Clone, Deserialize)]
pub struct FleetFile {
    /// The number of slots; chunks are routed over them.
    pub slots: u32,
    /// The cache dir every slot shares (local reads open its chunk files); `None` in a fleet file
    /// that does not say (written by hand, or by an older build): no local reads then.
    #[serde(default)]
    pub cache_dir: Option<PathBuf>,
    /// A fleet that caches nothing (an in-process engine of origin mode).
    #[serde(default)]
    pub passthrough: bool,
    /// How long the slots trust an object's metadata; 0 (or absent: an older build) trusts none.
    #[serde(default)]
    pub meta_ttl_secs: f64,
    /// The origin the fleet reaches (its requests are signed by the fleet, not by clients).
    #[serde(default)]
    pub origin: FleetOrigin,
    /// Whether the fleet is a node of a cluster pool.
    #[serde(rename = "cluster", default, deserialize_with = "present")]
    pub in_cluster: bool,
}

/// The origin settings of a fleet, as far as a client may compare them with its own.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct FleetOrigin {
    /// `AWS_ENDPOINT_URL` of the fleet; `None` for the AWS default.
    pub endpoint: Option<String>,
    /// The credentials file the fleet re-reads, if any.
    pub credentials_file: Option<PathBuf>,
}

impl FleetFile {
    /// Reads `<run dir>/fleet.json`: [`Error::Unavailable`] when there is none (no fleet started
    /// there), [`Error::Protocol`] when it is not a fleet's.
    pub fn read(run_dir: &Path) -> Result<FleetFile> {
        let path = fleet_file(run_dir);
        let text = std::fs::read(&path).map_err(|e| {
            Error::Unavailable(format!(
                "no memarts fleet in {} ({e}); start one with `memarts start_proxy N`",
                run_dir.display()
            ))
        })?;
        serde_json::from_slice(&text).map_err(|e| Error::Protocol(format!("{}: {e}", path.display())))
    }
}

fn present<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<bool, D::Error> {
    Ok(Option::<serde::de::IgnoredAny>::deserialize(d)?.is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fleet_file_gives_its_client_fields_and_ignores_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let write = |json: &str| std::fs::write(dir.path().join("fleet.json"), json).unwrap();
        write(
            r#"{"slots": 4, "cache_dir": "/c", "meta_ttl_secs": 60.0, "cluster": {"file": "x"},
                  "origin": {"endpoint": "http://e", "max_attempts": 6}, "capacity": 1}"#,
        );
        let f = FleetFile::read(dir.path()).unwrap();
        assert_eq!((f.slots, f.meta_ttl_secs, f.in_cluster, f.passthrough), (4, 60.0, true, false));
        assert_eq!(f.origin.endpoint.as_deref(), Some("http://e"));
        write(r#"{"slots": 2, "cache_dir": "/c", "cluster": null}"#);
        let f = FleetFile::read(dir.path()).unwrap();
        assert!(!f.in_cluster && f.meta_ttl_secs == 0.0 && f.origin.endpoint.is_none());
        write(r#"{"slots": 1}"#);
        assert!(FleetFile::read(dir.path()).unwrap().cache_dir.is_none());
        write("{}");
        assert!(matches!(FleetFile::read(dir.path()), Err(Error::Protocol(_))));
        std::fs::remove_file(dir.path().join("fleet.json")).unwrap();
        assert!(matches!(FleetFile::read(dir.path()), Err(Error::Unavailable(_))));
    }
}
