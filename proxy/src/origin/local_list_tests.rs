use super::*;
use rand::{Rng, SeedableRng};

/// A random tree under `root`: nested and flat directories, names that sort across the `/`
/// (`a`, `a-b`, `a.b`, `a0`), files and empty directories; returns every file, as paths.
fn tree(root: &Path, rng: &mut rand::rngs::StdRng, files: usize) -> Vec<PathBuf> {
    let stems = ["a", "a-b", "a.b", "a0", "b", "ba", "z", "é", "A"];
    let mut dirs = vec![root.to_path_buf()];
    let mut out = Vec::new();
    while out.len() < files {
        let parent = dirs[rng.random_range(0..dirs.len())].clone();
        let name = format!("{}{}", stems[rng.random_range(0..stems.len())], rng.random_range(0..40));
        let path = parent.join(&name);
        if path.exists() {
            continue;
        }
        if rng.random_bool(0.08) && dirs.len() < 60 {
            std::fs::create_dir(&path).unwrap();
            dirs.push(path);
        } else {
            std::fs::write(&path, b"x").unwrap();
            out.push(path);
        }
    }
    out
}

/// Every page of a listing, each of `page` entries, until one comes back short.
fn all_pages(l: &LocalListings, root: &Path, recursive: bool, page: usize) -> Vec<Found> {
    let mut out: Vec<Found> = Vec::new();
    loop {
        let after = out.last().map(|f| f.path.clone());
        let got = l.page(root, recursive, after.as_deref(), page).unwrap();
        let done = got.len() < page;
        out.extend(got);
        if done {
            return out;
        }
    }
}

fn components(p: &Path) -> Vec<String> {
    p.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect()
}

#[test]
fn pages_of_random_trees_list_every_file_once_in_one_order() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(29);
    for case in 0..12 {
        let dir = tempfile::tempdir().unwrap();
        let n = rng.random_range(1..3000);
        let files = tree(dir.path(), &mut rng, n);
        let listings = LocalListings::default();
        let page = [1, 7, 1000][case % 3];
        let got = all_pages(&listings, dir.path(), true, page);
        let mut want = files.clone();
        want.sort_by_key(|p| components(p));
        let got_paths: Vec<PathBuf> = got.iter().map(|f| f.path.clone()).collect();
        assert_eq!(got_paths, want, "case {case}, pages of {page}");
        assert!(got.iter().all(|f| !f.is_dir));
        // One level: the root's own files and directories, each once.
        let level = all_pages(&listings, dir.path(), false, page);
        let mut names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        let got_names: Vec<String> =
            level.iter().map(|f| f.path.file_name().unwrap().to_string_lossy().into_owned()).collect();
        assert_eq!(got_names, names, "case {case}");
        for f in &level {
            assert_eq!(f.is_dir, f.path.is_dir());
        }
    }
}

#[test]
fn a_flat_directory_is_read_once_per_listing_and_afresh_by_the_next() {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..2500 {
        std::fs::write(dir.path().join(format!("f{i:05}")), b"").unwrap();
    }
    let listings = LocalListings::default();
    let first = listings.page(dir.path(), true, None, 1000).unwrap();
    assert_eq!(listings.held(), 2500, "the names are kept for the next pages");
    // A file created after the first page of a listing is not in its later pages (they come from
    // the names read for the first) ...
    std::fs::write(dir.path().join("f99999"), b"").unwrap();
    let rest = all_pages_after(&listings, dir.path(), first.last().unwrap().path.clone());
    assert_eq!(first.len() + rest.len(), 2500);
    // ... which let go of them once they reached the directory's end ...
    assert_eq!(listings.held(), 0, "names held after the listing ended");
    // ... and a listing that starts again sees it.
    assert_eq!(all_pages(&listings, dir.path(), true, 1000).len(), 2501);
    assert_eq!(listings.held(), 0);
}

/// The pages after `after`, until one comes back short.
fn all_pages_after(l: &LocalListings, root: &Path, mut after: PathBuf) -> Vec<Found> {
    let mut out = Vec::new();
    loop {
        let got = l.page(root, true, Some(&after), 1000).unwrap();
        let done = got.len() < 1000;
        if let Some(last) = got.last() {
            after = last.path.clone();
        }
        out.extend(got);
        if done {
            return out;
        }
    }
}

#[test]
fn a_tree_listed_page_by_page_holds_the_names_of_the_directories_it_is_in_only() {
    let dir = tempfile::tempdir().unwrap();
    for d in 0..20 {
        let sub = dir.path().join(format!("d{d:02}"));
        std::fs::create_dir(&sub).unwrap();
        for i in 0..100 {
            std::fs::write(sub.join(format!("f{i:03}")), b"").unwrap();
        }
    }
    let listings = LocalListings::default();
    let mut after: Option<PathBuf> = None;
    let mut listed = 0;
    loop {
        let got = listings.page(dir.path(), true, after.as_deref(), 150).unwrap();
        listed += got.len();
        // The root's 20 names and those of the directory the page stopped in, at most.
        assert!(listings.held() <= 20 + 100, "{} names held", listings.held());
        if got.len() < 150 {
            break;
        }
        after = got.last().map(|f| f.path.clone());
    }
    assert_eq!(listed, 2000);
    assert_eq!(listings.held(), 0);
}

#[test]
fn missing_roots_files_and_symlink_loops_list_nothing_more_than_there_is() {
    let dir = tempfile::tempdir().unwrap();
    let l = LocalListings::default();
    assert!(l.page(&dir.path().join("absent"), true, None, 10).unwrap().is_empty());
    std::fs::write(dir.path().join("file"), b"").unwrap();
    assert!(l.page(&dir.path().join("file"), true, None, 10).unwrap().is_empty());
    std::fs::create_dir(dir.path().join("d")).unwrap();
    std::fs::write(dir.path().join("d/x"), b"").unwrap();
    std::os::unix::fs::symlink(dir.path(), dir.path().join("d/loop")).unwrap();
    let got = all_pages(&l, dir.path(), true, 3);
    let paths: Vec<String> =
        got.iter().map(|f| f.path.strip_prefix(dir.path()).unwrap().display().to_string()).collect();
    // The loop leads back to the root, which the walk is inside: not entered again.
    assert_eq!(paths, ["d/x", "file"]);
}
