//! Versions of objects as listings of their directories showed them, passed between the slots
//! of a fleet and the nodes of a pool (`Revalidate`, `Listed`): a warm epoch after the metadata
//! TTL asks the origin once per page of a directory, not once per object.

use serde::{Deserialize, Serialize};

use crate::message::ObjectMeta;

/// Metadata and how long ago the origin confirmed it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfirmedMeta {
    pub meta: ObjectMeta,
    pub confirmed_ms_ago: u64,
}

/// `Revalidate`: the object, and who asks (slot `slot` of a fleet of `slots`, reading with chunks of
/// `chunk_size`; 0 if it does not know): the answer also brings the versions of the directory's
/// other objects whose chunk 0 that slot owns, which it would ask for next.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RevalidateRequest {
    pub url: String,
    pub chunk_size: u64,
    pub slot: u32,
    pub slots: u32,
}

/// Answer to `Revalidate`: the object's version as its directory's listing showed it (`None` when no
/// listing can tell: the asking slot asks the origin with a HEAD), and at most
/// [`MAX_REVALIDATED`] other objects of the directory the asking slot serves, each with its URL.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Revalidated {
    pub meta: Option<ConfirmedMeta>,
    pub more: Vec<(String, ConfirmedMeta)>,
}

/// Most objects one `Revalidated` carries besides the one asked for.
pub const MAX_REVALIDATED: usize = 4096;

/// Most entries one `Listed` carries, over all its ranges.
pub const MAX_LISTED: usize = 4096;

/// What one page of a client's listing showed of one directory: every object of `dir` (the
/// directory's URL, `s3://bucket/a/b`, or `s3://bucket` for the bucket's top) whose key is in
/// `(after, last]` is in `entries` (keys, with their versions); `last: None`: to the directory's
/// end. `more`: the directory goes on past `last`. Listed `listed_ms_ago` before it was sent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListedRange {
    pub dir: String,
    pub after: Option<String>,
    pub last: Option<String>,
    pub more: bool,
    pub listed_ms_ago: u64,
    pub entries: Vec<(String, ObjectMeta)>,
}
