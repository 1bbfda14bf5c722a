//! End-to-end tests live in tests/ (`e2e/`, `reliability/`, `bench/`); this library holds the checks
//! of the repository itself.

#[cfg(test)]
mod docs {
    use std::path::{Path, PathBuf};

    fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                sources(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }

    /// docs/ARCHITECTURE.md stays current: every product source file is named there (test modules
    /// and the `lib.rs` / `mod.rs` / `main.rs` of a crate or module aside).
    #[test]
    fn every_source_file_is_on_the_architecture_map() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let map = std::fs::read_to_string(root.join("docs/ARCHITECTURE.md")).unwrap();
        let mut files = Vec::new();
        for krate in ["protocol", "disk", "settings", "shim", "session", "shim/python", "proxy", "ops"] {
            sources(&root.join(krate).join("src"), &mut files);
        }
        let missing: Vec<String> = files
            .iter()
            .filter_map(|f| {
                let name = f.file_name()?.to_str()?;
                let test = name.ends_with("_tests.rs") || name.starts_with("conformance");
                let root_of_module = matches!(name, "lib.rs" | "mod.rs" | "main.rs");
                (!test && !root_of_module && !map.contains(name))
                    .then(|| f.strip_prefix(root).unwrap().display().to_string())
            })
            .collect();
        assert!(missing.is_empty(), "docs/ARCHITECTURE.md does not name: {missing:?}");
    }

    /// A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces as hyphens.
    fn anchor(heading: &str) -> String {
        heading
            .trim()
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect()
    }

    /// The README and docs/ link to each other by relative paths and anchors; after a page is split
    /// or a heading renamed, every such link must still reach a file and a heading.
    #[test]
    fn every_relative_link_of_the_docs_reaches_a_file_and_a_heading() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let mut pages = vec![root.join("README.md")];
        for entry in std::fs::read_dir(root.join("docs")).unwrap().flatten() {
            pages.push(entry.path());
        }
        let mut broken = Vec::new();
        for page in &pages {
            let text = std::fs::read_to_string(page).unwrap();
            for (_, rest) in text.match_indices("](").map(|(i, _)| text.split_at(i + 2)) {
                let Some(end) = rest.find(')') else { continue };
                let link = &rest[..end];
                if link.contains("://") || link.starts_with("mailto:") || link.contains(' ') {
                    continue;
                }
                let (file, fragment) = link.split_once('#').unwrap_or((link, ""));
                let target = if file.is_empty() { page.clone() } else { page.parent().unwrap().join(file) };
                let Ok(body) = std::fs::read_to_string(&target).or_else(|e| {
                    if target.exists() {
                        Ok(String::new())
                    } else {
                        Err(e)
                    }
                }) else {
                    broken.push(format!("{}: {link} (no such file)", page.display()));
                    continue;
                };
                let mut headings = body.lines().filter_map(|l| l.strip_prefix('#'));
                if !fragment.is_empty() && !headings.any(|h| anchor(h.trim_start_matches('#')) == fragment) {
                    broken.push(format!("{}: {link} (no such heading)", page.display()));
                }
            }
        }
        assert!(broken.is_empty(), "broken links: {broken:#?}");
    }

    /// A worker that only talks to a fleet links the shim alone: the engine (`memarts-proxy`, with
    /// tokio, the origin clients and the chunk store) comes only with `memarts-session`.
    #[test]
    fn the_shim_links_no_engine() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let out = std::process::Command::new(cargo)
            .args(["tree", "--offline", "-p", "memarts-shim", "-e", "normal", "--prefix", "none"])
            .current_dir(root)
            .output()
            .unwrap();
        assert!(out.status.success(), "cargo tree: {}", String::from_utf8_lossy(&out.stderr));
        let tree = String::from_utf8(out.stdout).unwrap();
        assert!(tree.contains("memarts-protocol"), "not the shim's tree: {tree}");
        assert!(!tree.contains("memarts-proxy"), "the shim links the engine: {tree}");
        assert!(!tree.contains("tokio"), "the shim links an async runtime: {tree}");
    }
}

/// `fleet.json` has one writer (`FleetConfig::write_fleet_file`) and one client-side reader
/// (`memarts_shim::FleetFile`); this keeps the reader's fields in step with what the writer writes.
#[cfg(test)]
mod fleet_file {
    use memarts_proxy::config::FleetConfig;
    use memarts_shim::FleetFile;

    #[test]
    fn what_the_fleet_writes_its_clients_read() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = FleetConfig {
            run_dir: dir.path().to_path_buf(),
            slots: 6,
            meta_ttl_secs: 42.0,
            ..Default::default()
        };
        cfg.cache_dir = dir.path().join("cache");
        cfg.origin.endpoint = Some("http://127.0.0.1:9".into());
        cfg.origin.credentials_file = Some(dir.path().join("creds.json"));
        cfg.write_fleet_file().unwrap();
        let read = FleetFile::read(dir.path()).unwrap();
        assert_eq!(
            (read.slots, read.meta_ttl_secs, read.passthrough, read.in_cluster),
            (6, 42.0, false, false)
        );
        assert_eq!(read.cache_dir, Some(cfg.cache_dir.clone()));
        assert_eq!(read.origin.endpoint, cfg.origin.endpoint);
        assert_eq!(read.origin.credentials_file, cfg.origin.credentials_file);
        assert_eq!(FleetConfig::load(&cfg.fleet_file()).unwrap().slots, 6, "the slots read it back whole");
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(cfg.fleet_file()).unwrap().permissions(),
        );
        assert_eq!(mode & 0o777, 0o600, "a fleet serving only its own uid keeps fleet.json to itself");
    }
}
