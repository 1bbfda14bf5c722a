//! Warming: objects brought into the cache by their slots without their bytes coming back
//! (`Request::Fill`), for `memarts warmup`, which reads only to fill. Each URL goes to the slot
//! that owns its chunk 0, as its first read would.

use std::time::Instant;

use memarts_protocol::{chunk_owner, FillRequest, ObjectMeta, Request, Response, MAX_FILL_URLS};

use crate::answer::expect_answer;
use crate::client::{parse, Client};
use crate::error::{Error, Result};

impl Client {
    /// Has each of `urls` read into the cache as its first read would (metadata and chunk 0, one
    /// GET when cold), without its bytes: per URL, in order, its metadata or why it could not be
    /// read. The rest of an object larger than a chunk is the caller's to read. One request per
    /// slot, one slot after the other (batches of URLs over several slots measured no faster for
    /// `memarts warmup` than one URL per call from many threads). A slot too old to know `Fill`
    /// answers with an error for which [`Error::is_unknown_request`] holds (the caller reads
    /// those objects instead).
    pub fn fill_heads(&self, urls: &[&str]) -> Vec<Result<ObjectMeta>> {
        let cs = self.cfg.chunk_size;
        let slots = self.slots();
        let mut out: Vec<Option<Result<ObjectMeta>>> = (0..urls.len()).map(|_| None).collect();
        let mut by_slot: Vec<Vec<(usize, String)>> = vec![Vec::new(); slots as usize];
        for (i, url) in urls.iter().enumerate() {
            match parse(url) {
                Ok(parsed) => {
                    by_slot[chunk_owner(&parsed, cs, 0, slots) as usize].push((i, parsed.to_string()))
                }
                Err(e) => out[i] = Some(Err(e)),
            }
        }
        for (slot, group) in by_slot.iter().enumerate() {
            for part in group.chunks(MAX_FILL_URLS) {
                for ((i, _), r) in part.iter().zip(self.fill_part(slot as u32, part)) {
                    out[*i] = Some(r);
                }
            }
        }
        out.into_iter().map(|r| r.unwrap_or_else(|| Err(Error::Protocol("no answer".into())))).collect()
    }

    /// One `Fill` of `part` (URLs whose chunk 0 `slot` owns): a result per URL, in order.
    fn fill_part(&self, slot: u32, part: &[(usize, String)]) -> Vec<Result<ObjectMeta>> {
        let req = Request::Fill(FillRequest {
            urls: part.iter().map(|(_, u)| u.clone()).collect(),
            chunk_size: self.cfg.chunk_size,
        });
        let deadline = Instant::now() + self.cfg.deadline;
        let answer = self.with_slot(slot, deadline, |conn| {
            let reply = conn.call(&req)?;
            expect_answer!(reply.response, "Fill", Response::Filled(results) => results)
        });
        match answer {
            Ok(results) if results.len() == part.len() => {
                results.into_iter().map(|r| r.map_err(Error::from)).collect()
            }
            Ok(results) => {
                let why = format!("{} answers to a Fill of {} URLs", results.len(), part.len());
                part.iter().map(|_| Err(Error::Protocol(why.clone()))).collect()
            }
            Err(e) => part.iter().map(|_| Err(e.duplicate())).collect(),
        }
    }
}
