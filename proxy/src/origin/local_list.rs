//! Listings of local directories, page after page. A page continues after the last entry of the
//! one before (`start_after`), so the order must be the same from page to page: object_store's
//! local listing walks directories in the file system's order (hash order on ext4), and a page of
//! "the next 1,000 after X" in that order skipped some entries and repeated others (5 × 1,000 files
//! listed as 3,668 entries, 2,813 of them distinct). Here a tree is walked depth first with the
//! names of each directory sorted: entries come in the order of their path components compared one
//! by one (`a/z` before `a-b`, as `a` < `a-b`), and a page resumes by descending straight to where
//! the last one stopped, reading only the directories on that path and after it.
//!
//! A directory's sorted names are kept for the pages that follow while a listing is inside it (a
//! minute at most, [`KEEP`]; at most [`MAX_NAMES`] names in all), so that a directory of a million
//! files is read once per listing, not once per page; a listing that starts afresh reads every
//! directory afresh. The names of a directory a page walked to its end are let go: no later page
//! of that listing comes back to it (a listing of a million files held them all until it was over,
//! ~45 bytes a file, and for a minute after). Symlinks are
//! followed, as the reads follow them, and a directory met again below itself (a symlink loop) is
//! skipped. Names that are not UTF-8 cannot be named by a URL and are left out.

use std::collections::HashSet;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lru::LruCache;

/// How long a directory's sorted names serve the next pages of a listing.
pub const KEEP: Duration = Duration::from_secs(60);
/// Names kept at most, over every directory (about 50 bytes each).
pub const MAX_NAMES: usize = 4 << 20;
/// Directories below the root a walk goes down at most.
const MAX_DEPTH: usize = 256;

/// One entry of a page: its path and whether it is a directory (non-recursive listings only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub path: PathBuf,
    pub is_dir: bool,
}

#[derive(Debug)]
struct Name {
    name: String,
    dir: bool,
}

struct Listed {
    at: Instant,
    names: Arc<Vec<Name>>,
}

/// The sorted names of the directories listings are walking through (see the module docs).
pub struct LocalListings {
    dirs: Mutex<(LruCache<PathBuf, Listed>, usize)>,
}

impl Default for LocalListings {
    fn default() -> LocalListings {
        LocalListings { dirs: Mutex::new((LruCache::unbounded(), 0)) }
    }
}

impl LocalListings {
    /// At most `max` entries below `root` that come after `after` (a path below `root`; `None`:
    /// from the start), every file below it if `recursive`, else its own files and directories.
    /// A root that does not exist, or is not a directory, lists nothing. Blocking.
    pub fn page(
        &self,
        root: &Path,
        recursive: bool,
        after: Option<&Path>,
        max: usize,
    ) -> io::Result<Vec<Found>> {
        let resume: Option<Vec<String>> = after.map(|a| {
            a.strip_prefix(root)
                .unwrap_or(a)
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into())
                .collect()
        });
        let mut walk = Walk {
            cache: self,
            fresh: after.is_none(),
            recursive,
            max,
            out: Vec::new(),
            above: HashSet::new(),
            walked: Vec::new(),
        };
        let visited = walk.visit(root, resume.as_deref(), 0);
        self.let_go(&walk.walked);
        match visited {
            Err(e) if matches!(e.kind(), io::ErrorKind::NotFound | io::ErrorKind::NotADirectory) => {
                Ok(Vec::new())
            }
            Err(e) => Err(e),
            Ok(()) => Ok(walk.out),
        }
    }

    /// Lets go of the names of `walked` (directories a page went through to their end).
    fn let_go(&self, walked: &[PathBuf]) {
        let mut dirs = self.dirs.lock().unwrap_or_else(|p| p.into_inner());
        let (cache, total) = &mut *dirs;
        for dir in walked {
            if let Some(old) = cache.pop(dir) {
                *total -= old.names.len();
            }
        }
    }

    /// Names held now, over every directory.
    #[cfg(test)]
    fn held(&self) -> usize {
        self.dirs.lock().unwrap().1
    }

    /// The sorted names of `dir`: kept ones unless `fresh`, else read (and kept).
    fn names(&self, dir: &Path, fresh: bool) -> io::Result<Arc<Vec<Name>>> {
        if !fresh {
            let mut dirs = self.dirs.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(listed) = dirs.0.get(dir).filter(|l| l.at.elapsed() < KEEP) {
                return Ok(listed.names.clone());
            }
        }
        let names = Arc::new(read_sorted(dir)?);
        let mut dirs = self.dirs.lock().unwrap_or_else(|p| p.into_inner());
        let (cache, total) = &mut *dirs;
        if let Some(old) = cache.put(dir.to_path_buf(), Listed { at: Instant::now(), names: names.clone() }) {
            *total -= old.names.len();
        }
        *total += names.len();
        // Over the bound, or no longer of use (a listing given up part way).
        while *total > MAX_NAMES || cache.peek_lru().is_some_and(|(_, l)| l.at.elapsed() >= KEEP) {
            match cache.pop_lru() {
                Some((_, old)) => *total -= old.names.len(),
                None => break,
            }
        }
        Ok(names)
    }
}

/// One page's walk.
struct Walk<'a> {
    cache: &'a LocalListings,
    fresh: bool,
    recursive: bool,
    max: usize,
    out: Vec<Found>,
    /// (device, inode) of the directories the walk is inside.
    above: HashSet<(u64, u64)>,
    /// The directories the walk went through to their end.
    walked: Vec<PathBuf>,
}

impl Walk<'_> {
    /// The entries of `dir` in order, from `resume` on (the components of the last entry listed,
    /// below `dir`), until the page is full.
    fn visit(&mut self, dir: &Path, resume: Option<&[String]>, depth: usize) -> io::Result<()> {
        let meta = std::fs::metadata(dir)?;
        if !meta.is_dir() {
            return Err(io::ErrorKind::NotADirectory.into());
        }
        if depth > MAX_DEPTH || !self.above.insert((meta.dev(), meta.ino())) {
            return Ok(());
        }
        let names = self.cache.names(dir, self.fresh)?;
        let (first, rest) = match resume {
            Some([first, rest @ ..]) => (Some(first.as_str()), rest),
            _ => (None, &[][..]),
        };
        let start = first.map_or(0, |f| names.partition_point(|n| n.name.as_str() < f));
        for n in &names[start..] {
            if self.out.len() >= self.max {
                break;
            }
            let path = dir.join(&n.name);
            let resumes_here = first == Some(n.name.as_str());
            match (n.dir, self.recursive) {
                (true, true) => {
                    let rest = resumes_here.then_some(rest).filter(|r| !r.is_empty());
                    match self.visit(&path, rest, depth + 1) {
                        // Gone or replaced since the directory was read: nothing below it now.
                        Err(e)
                            if matches!(e.kind(), io::ErrorKind::NotFound | io::ErrorKind::NotADirectory) => {
                        }
                        other => other?,
                    }
                }
                _ if resumes_here => {}
                (is_dir, _) => self.out.push(Found { path, is_dir }),
            }
        }
        if self.out.len() < self.max {
            self.walked.push(dir.to_path_buf());
        }
        self.above.remove(&(meta.dev(), meta.ino()));
        Ok(())
    }
}

/// The names in `dir`, sorted, each marked a directory or not (a symlink as what it leads to; a
/// dangling one is a file, whose read will say it is not there).
fn read_sorted(dir: &Path) -> io::Result<Vec<Name>> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let Ok(name) = entry.file_name().into_string() else { continue };
        let kind = entry.file_type()?;
        let dir = if kind.is_symlink() {
            std::fs::metadata(entry.path()).is_ok_and(|m| m.is_dir())
        } else {
            kind.is_dir()
        };
        names.push(Name { name, dir });
    }
    names.sort_unstable_by(|a, b| a.name.cmp(&b.name));
    Ok(names)
}

#[cfg(test)]
#[path = "local_list_tests.rs"]
mod tests;
