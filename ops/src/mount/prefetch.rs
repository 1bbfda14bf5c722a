//! The read-ahead workers: a few threads shared by every open file, fetching the chunks readers
//! asked for ahead of time. The queue is bounded by the budget (each queued chunk holds its lease),
//! not by a length.

use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};

use super::budget::Lease;
use super::reader::Reader;

type Job = (Arc<Reader>, u64, Lease);

pub struct Prefetcher {
    queue: Mutex<Sender<Job>>,
}

impl Prefetcher {
    /// `workers` threads; they end when the prefetcher is dropped.
    pub fn start(workers: usize) -> std::io::Result<Prefetcher> {
        let (tx, rx) = channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..workers.max(1) {
            let rx = rx.clone();
            std::thread::Builder::new().name(format!("readahead-{i}")).spawn(move || work(&rx))?;
        }
        Ok(Prefetcher { queue: Mutex::new(tx) })
    }

    pub fn submit(&self, reader: Arc<Reader>, index: u64, lease: Lease) {
        let queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = queue.send((reader, index, lease)) {
            // No worker is left (only at exit): let the reader fetch the chunk itself.
            let (reader, index, lease) = e.0;
            reader.prefetched(index, lease);
        }
    }
}

fn work(rx: &Mutex<Receiver<Job>>) {
    loop {
        let job = rx.lock().unwrap_or_else(|p| p.into_inner()).recv();
        let Ok((reader, index, lease)) = job else { return };
        reader.prefetched(index, lease);
    }
}
