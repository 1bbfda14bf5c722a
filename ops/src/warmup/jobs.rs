//! The objects a warmup reads, as they become known: the pages of one recursive LIST of the prefix
//! (paginated, no per-directory walk), or the lines of a manifest, with no LIST at all. A lister
//! thread fills the queue while the readers empty it, so reading starts with the first page
//! instead of after the last one: a prefix of a million keys is a thousand LIST round trips, which
//! the reads now overlap.

use std::collections::VecDeque;
use std::path::Path;
use std::sync::{Condvar, Mutex};

use anyhow::{Context, Result};
use memarts_shim::Client;

use crate::access::AboutUrl;

/// Keys per LIST page (the S3 maximum).
const PAGE: u32 = 1000;

/// One object to read: its URL, and its size when a LIST said it (for the progress bar).
pub struct Job {
    pub url: String,
    pub size: Option<u64>,
}

#[derive(Default)]
struct State {
    waiting: VecDeque<Job>,
    /// Objects queued so far, and their bytes when every one's size is known.
    queued: u64,
    queued_bytes: Option<u64>,
    /// Set when no more jobs will come; `error` when the listing failed before its end.
    done: bool,
    error: Option<anyhow::Error>,
}

/// Jobs pushed by one lister and taken by many readers.
pub struct Jobs {
    state: Mutex<State>,
    changed: Condvar,
}

impl Jobs {
    pub fn new() -> Jobs {
        Jobs {
            state: Mutex::new(State { queued_bytes: Some(0), ..State::default() }),
            changed: Condvar::new(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn push(&self, jobs: impl IntoIterator<Item = Job>) {
        let mut state = self.state();
        for job in jobs {
            state.queued += 1;
            state.queued_bytes = state.queued_bytes.zip(job.size).map(|(a, b)| a + b);
            state.waiting.push_back(job);
        }
        drop(state);
        self.changed.notify_all();
    }

    fn finish(&self, error: Option<anyhow::Error>) {
        let mut state = self.state();
        state.done = true;
        state.error = error;
        drop(state);
        self.changed.notify_all();
    }

    /// The next job, waiting for the lister if need be; `None` once every job was taken.
    pub fn next(&self) -> Option<Job> {
        let mut state = self.state();
        loop {
            if let Some(job) = state.waiting.pop_front() {
                return Some(job);
            }
            if state.done {
                return None;
            }
            state = self.changed.wait(state).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Objects queued so far, their bytes if every size is known, and whether the listing is over.
    pub fn progress(&self) -> (u64, Option<u64>, bool) {
        let state = self.state();
        (state.queued, state.queued_bytes, state.done)
    }

    /// Why the listing stopped early, once it is over (taken: asked once, at the end).
    pub fn take_error(&self) -> Option<anyhow::Error> {
        self.state().error.take()
    }

    /// Lists `prefix` page by page into the queue (one recursive LIST, paginated); a failed page
    /// ends the listing with its error.
    pub fn list(&self, client: &Client, prefix: &str) {
        let mut start_after = None;
        let error = loop {
            match client.list_page(prefix, true, start_after.take(), PAGE).about(prefix) {
                Ok(page) => {
                    self.push(
                        page.entries
                            .into_iter()
                            .filter(|e| !e.is_dir)
                            .map(|e| Job { size: Some(e.size), url: e.url }),
                    );
                    match page.next {
                        Some(next) => start_after = Some(next),
                        None => break None,
                    }
                }
                Err(e) => break Some(e),
            }
        };
        self.finish(error);
    }

    /// Queues the objects `manifest` names: one per line, its first field a URL or a key relative
    /// to `prefix`; `#` starts a comment.
    pub fn read_manifest(&self, manifest: &Path, prefix: &str) -> Result<()> {
        let text = std::fs::read_to_string(manifest)
            .with_context(|| format!("reading the manifest {}", manifest.display()))?;
        let base = prefix.trim_end_matches('/');
        self.push(
            text.lines()
                .filter_map(|line| line.split_whitespace().next())
                .filter(|key| !key.starts_with('#'))
                .map(|key| Job {
                    url: if key.contains("://") || key.starts_with('/') {
                        key.to_string()
                    } else {
                        format!("{base}/{}", key.trim_start_matches('/'))
                    },
                    size: None,
                }),
        );
        self.finish(None);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(url: &str, size: Option<u64>) -> Job {
        Job { url: url.to_string(), size }
    }

    #[test]
    fn readers_take_jobs_as_they_come_and_stop_when_the_listing_ends() {
        let jobs = Jobs::new();
        std::thread::scope(|s| {
            let reader = s.spawn(|| {
                let mut got = Vec::new();
                while let Some(j) = jobs.next() {
                    got.push(j.url);
                }
                got
            });
            jobs.push([job("a", Some(1)), job("b", Some(2))]);
            std::thread::sleep(std::time::Duration::from_millis(20));
            jobs.push([job("c", Some(3))]);
            assert_eq!(jobs.progress(), (3, Some(6), false));
            jobs.finish(None);
            assert_eq!(reader.join().unwrap(), ["a", "b", "c"]);
        });
        assert_eq!(jobs.progress(), (3, Some(6), true));
        assert!(jobs.take_error().is_none());
    }

    #[test]
    fn an_unknown_size_makes_the_byte_total_unknown_and_an_error_is_kept() {
        let jobs = Jobs::new();
        jobs.push([job("a", Some(1)), job("b", None)]);
        jobs.finish(Some(anyhow::anyhow!("page 2 failed")));
        assert_eq!(jobs.progress(), (2, None, true));
        assert_eq!(jobs.next().map(|j| j.url).as_deref(), Some("a"));
        assert_eq!(jobs.next().map(|j| j.url).as_deref(), Some("b"));
        assert!(jobs.next().is_none());
        assert_eq!(jobs.take_error().unwrap().to_string(), "page 2 failed");
    }

    #[test]
    fn a_manifest_resolves_keys_against_the_prefix_and_skips_comments() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.txt");
        std::fs::write(&path, "# set\na 1\n/local/file\n\ns3://b/x\nc/d\n").unwrap();
        let jobs = Jobs::new();
        jobs.read_manifest(&path, "s3://b/p/").unwrap();
        let urls: Vec<String> = std::iter::from_fn(|| jobs.next()).map(|j| j.url).collect();
        assert_eq!(urls, ["s3://b/p/a", "/local/file", "s3://b/x", "s3://b/p/c/d"]);
        assert!(jobs.read_manifest(&dir.path().join("none"), "s3://b").is_err());
    }
}
