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
}
