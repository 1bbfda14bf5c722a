//! The part of read-ahead a process shares: its memory budget (`budget.rs`) and the few threads
//! that fetch every window's chunks ahead of its reader, in the order they were queued (lowest
//! first within a window). A forked child (a DataLoader worker) has none of its parent's threads
//! and none of its windows: it starts both afresh, with a budget of its own, at its first
//! read-ahead.

use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};

use super::budget::Budget;
use crate::per_process::PerProcess;

/// A fetch queued by a window; it does nothing if its window is gone.
pub(crate) type Job = Box<dyn FnOnce() + Send>;

/// A client's read-ahead settings and, per process, its [`Process`] part.
pub(crate) struct Readaheads {
    memory: u64,
    workers: usize,
    process: PerProcess<Option<Arc<Process>>>,
}

/// The budget and the fetch threads of one process; the threads end when it is dropped (when the
/// client and every window of the process are).
pub(crate) struct Process {
    pub(crate) budget: Arc<Budget>,
    queue: Mutex<Option<Sender<Job>>>,
}

impl Readaheads {
    /// `memory` bytes for all windows, fetched ahead by up to `workers` threads.
    pub(crate) fn new(memory: u64, workers: usize) -> Readaheads {
        Readaheads { memory, workers: workers.max(1), process: PerProcess::new() }
    }

    /// This process's part, started at the first call in the process.
    pub(crate) fn process(&self) -> Arc<Process> {
        let mut process = self.process.lock();
        process.get_or_insert_with(|| Process::start(self.memory, self.workers)).clone()
    }
}

impl Process {
    fn start(memory: u64, workers: usize) -> Arc<Process> {
        let (tx, rx) = channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let mut started = 0;
        for i in 0..workers {
            let rx = rx.clone();
            if std::thread::Builder::new().name(format!("memarts-ahead{i}")).spawn(move || work(&rx)).is_ok()
            {
                started += 1;
            }
        }
        // No thread to spare: nothing is fetched ahead; readers fetch their queued chunks themselves
        // when they get there.
        let queue = (started > 0).then_some(tx);
        Arc::new(Process { budget: Budget::new(memory), queue: Mutex::new(queue) })
    }

    /// Queues `jobs` for the fetch threads; false if there are none.
    pub(crate) fn submit(&self, jobs: Vec<Job>) -> bool {
        let queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        let Some(tx) = queue.as_ref() else { return false };
        jobs.into_iter().all(|job| tx.send(job).is_ok())
    }
}

fn work(rx: &Mutex<Receiver<Job>>) {
    loop {
        let job = rx.lock().unwrap_or_else(|p| p.into_inner()).recv();
        let Ok(job) = job else { return };
        job();
    }
}
