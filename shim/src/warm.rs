//! Warming: objects brought into the cache by their slots without their bytes coming back
//! (`Request::Fill`), for `memarts warmup`, which reads only to fill. Each URL goes to the slot
//! that owns its chunk 0, as its first read would.

use std::time::Instant;

use memarts_protocol::{chunk_owner, FillRequest, ObjectMeta, Request, Response};

use crate::answer::expect_answer;
use crate::client::{parse, Client};
use crate::error::{Error, Result};

impl Client {
    /// Has `url` read into the cache as its first read would (metadata and chunk 0, one GET when
    /// cold), without its bytes: its metadata, or why it could not be read. The rest of an object
    /// larger than a chunk is the caller's to read. One URL per request: `Fill` takes several,
    /// but batches of URLs measured no faster for `memarts warmup` than one URL per call from many
    /// threads. A slot too old to know `Fill` answers with an error for which
    /// [`Error::is_unknown_request`] holds (the caller reads the object instead).
    pub fn fill_head(&self, url: &str) -> Result<ObjectMeta> {
        let cs = self.cfg.chunk_size;
        let parsed = parse(url)?;
        let slot = chunk_owner(&parsed, cs, 0, self.slots());
        let req = Request::Fill(FillRequest { urls: vec![parsed.to_string()], chunk_size: cs });
        let deadline = Instant::now() + self.cfg.deadline;
        let results = self.conns.with_slot(slot, deadline, |conn| {
            let reply = conn.call(&req)?;
            expect_answer!(reply.response, "Fill", Response::Filled(results) => results)
        })?;
        match <[_; 1]>::try_from(results) {
            Ok([result]) => result.map_err(Error::from),
            Err(other) => Err(Error::Protocol(format!("{} answers to a Fill of one URL", other.len()))),
        }
    }
}
