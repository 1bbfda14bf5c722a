//! When a listing is worth asking for, to revalidate expired metadata (`revalidate.rs`), rather
//! than a HEAD per object:
//!
//! - not in a bucket whose listings the origin refused (403: a policy with `s3:GetObject` and no
//!   `s3:ListBucket` is common), for the metadata TTL: each object would cost a refused LIST and
//!   then its HEAD;
//! - not in a bucket whose listings name no versions (no ETags: some S3-compatible servers), for
//!   the TTL: they cannot revalidate anything;
//! - not in a directory whose listing just failed (503s, resets, after the origin's own retries),
//!   for [`FAILED_FOR`]: its objects are asked with HEADs meanwhile;
//! - not in a directory where this slot holds few of the objects a listing shows (fewer than one
//!   in [`SPARSE`]), for the TTL: a page lists about 1,000 keys, and S3 prices a LIST as about
//!   12 HEADs, so a page pays when it saves more than that many HEADs. A prefix of 100,000
//!   objects of which 10 are cached is then revalidated with one page and HEADs, not 100 pages.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use lru::LruCache;

/// How long a directory whose listing failed is asked about with HEADs.
pub const FAILED_FOR: Duration = Duration::from_secs(10);
/// A listing that shows a slot fewer than one of its objects in this many that it holds tells
/// that the directory is sparse here.
pub const SPARSE: usize = 64;
/// Objects a listing must show a slot before it tells anything of how many the slot holds.
const SAMPLE: usize = 64;
/// Buckets and directories remembered.
const REMEMBERED: usize = 4096;

pub struct ListPolicy {
    ttl: Duration,
    /// `bucket:<name>` or a directory's URL, and until when it is not listed.
    skip: Mutex<LruCache<String, Instant>>,
}

impl ListPolicy {
    pub fn new(ttl: Duration) -> ListPolicy {
        let cap = std::num::NonZeroUsize::new(REMEMBERED).expect("non-zero");
        ListPolicy { ttl, skip: Mutex::new(LruCache::new(cap)) }
    }

    fn skipped(&self, key: &str) -> bool {
        let mut skip = self.skip.lock().unwrap_or_else(|p| p.into_inner());
        match skip.get(key) {
            Some(until) if *until > Instant::now() => true,
            Some(_) => {
                skip.pop(key);
                false
            }
            None => false,
        }
    }

    fn skip_for(&self, key: String, how_long: Duration) {
        let until = Instant::now() + how_long;
        self.skip.lock().unwrap_or_else(|p| p.into_inner()).put(key, until);
    }

    /// Whether directory `dir` of `bucket` may be listed now.
    pub fn may_list(&self, bucket: &str, dir: &str) -> bool {
        !self.skipped(&format!("bucket:{bucket}")) && !self.skipped(dir)
    }

    /// A listing of `dir` of `bucket` failed; `refused`: the origin refused it (403).
    pub fn failed(&self, bucket: &str, dir: &str, refused: bool) {
        match refused {
            true => self.skip_for(format!("bucket:{bucket}"), self.ttl),
            false => self.skip_for(dir.to_string(), FAILED_FOR.min(self.ttl)),
        }
    }

    /// A listing of `bucket` showed objects without their ETags.
    pub fn unversioned(&self, bucket: &str) {
        self.skip_for(format!("bucket:{bucket}"), self.ttl);
    }

    /// A listing of `dir` showed a slot `shown` objects it serves, `held` of which it holds.
    pub fn shown(&self, dir: &str, shown: usize, held: usize) {
        if shown >= SAMPLE && held.saturating_mul(SPARSE) < shown {
            self.skip_for(dir.to_string(), self.ttl);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_failures_and_sparse_directories_are_not_listed_for_a_while() {
        let p = ListPolicy::new(Duration::from_millis(300));
        assert!(p.may_list("b", "s3://b/d"));
        p.failed("b", "s3://b/d", true);
        assert!(!p.may_list("b", "s3://b/other"), "a refusal holds for the bucket");
        assert!(p.may_list("c", "s3://c/d"));
        p.unversioned("u");
        assert!(!p.may_list("u", "s3://u/any"), "listings without versions are not asked for");
        p.failed("c", "s3://c/d", false);
        assert!(!p.may_list("c", "s3://c/d") && p.may_list("c", "s3://c/e"), "a failure, for its directory");
        p.shown("s3://e/few", 1000, 10);
        p.shown("s3://e/small", 10, 0);
        p.shown("s3://e/dense", 1000, 900);
        assert!(!p.may_list("e", "s3://e/few"));
        assert!(p.may_list("e", "s3://e/small"), "too few shown to tell");
        assert!(p.may_list("e", "s3://e/dense"));
        std::thread::sleep(Duration::from_millis(320));
        assert!(p.may_list("b", "s3://b/d") && p.may_list("c", "s3://c/d") && p.may_list("e", "s3://e/few"));
    }
}
