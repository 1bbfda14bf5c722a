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
        for krate in ["protocol", "settings", "shim", "shim/python", "proxy", "ops"] {
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
}
