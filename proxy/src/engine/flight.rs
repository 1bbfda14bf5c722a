//! Single-flight: however many requests miss one chunk at once, one origin fetch runs; the others wait
//! for its result. The fetch runs in its own task, so a client that disconnects cancels nothing.

use std::future::Future;
use std::sync::Arc;

use dashmap::DashMap;
use memarts_protocol::{ErrorCode, WireError};
use tokio::sync::watch;

type Flight<V> = watch::Receiver<Option<V>>;

pub struct Flights<V> {
    inflight: DashMap<u128, Flight<V>>,
}

impl<V: Clone + Send + Sync + 'static> Default for Flights<V> {
    fn default() -> Self {
        Flights { inflight: DashMap::new() }
    }
}

/// Handed to the leader's task: publish the result, then (after any follow-up work such as writing
/// the chunk to disk) drop it to end the flight.
pub struct Leader<V> {
    flights: Arc<Flights<V>>,
    id: u128,
    tx: watch::Sender<Option<V>>,
}

impl<V> Leader<V> {
    pub fn publish(&self, value: V) {
        self.tx.send_replace(Some(value));
    }
}

impl<V> Drop for Leader<V> {
    fn drop(&mut self) {
        self.flights.inflight.remove(&self.id);
    }
}

impl<V: Clone + Send + Sync + 'static> Flights<V> {
    /// Joins the flight for `id`, or starts it with `start(leader)` (which must publish a value and
    /// may keep the flight open while it finishes work, e.g. persisting the chunk). Returns the value
    /// and whether this call started the flight. `on_abandoned` is the value when the leader dropped
    /// without publishing (a panic).
    pub async fn join<F, Fut>(
        self: &Arc<Self>,
        id: u128,
        start: F,
        on_abandoned: impl FnOnce() -> V,
    ) -> (V, bool)
    where
        F: FnOnce(Leader<V>) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let (mut rx, led) = match self.inflight.entry(id) {
            dashmap::Entry::Occupied(e) => (e.get().clone(), false),
            dashmap::Entry::Vacant(e) => {
                let (tx, rx) = watch::channel(None);
                e.insert(rx.clone());
                tokio::spawn(start(Leader { flights: self.clone(), id, tx }));
                (rx, true)
            }
        };
        let value = match rx.wait_for(Option::is_some).await {
            Ok(v) => v.clone().expect("wait_for(is_some)"),
            Err(_) => on_abandoned(),
        };
        (value, led)
    }

    /// Waits until the flight `id`, if one is running, has published, and returns what it published
    /// (`None`: no flight, or its leader dropped without publishing). (See also
    /// [`Flights::join_fallible`], the join every fill of the slot uses.)
    pub async fn wait(&self, id: u128) -> Option<V> {
        let mut rx = self.inflight.get(&id).map(|e| e.value().clone())?;
        let value = rx.wait_for(Option::is_some).await.ok()?.clone();
        value
    }

    /// Whether a flight for `id` is running.
    pub fn running(&self, id: u128) -> bool {
        self.inflight.contains_key(&id)
    }

    pub fn len(&self) -> usize {
        self.inflight.len()
    }

    pub fn is_empty(&self) -> bool {
        self.inflight.is_empty()
    }
}

impl<T: Clone + Send + Sync + 'static> Flights<Result<T, WireError>> {
    /// [`Flights::join`] for work that can fail, which is all of a slot's: returns the value only,
    /// and a leader that ends without publishing (a panic) leaves its waiters an `Internal` error
    /// saying that `what` was abandoned.
    pub async fn join_fallible<F, Fut>(
        self: &Arc<Self>,
        id: u128,
        what: &str,
        start: F,
    ) -> Result<T, WireError>
    where
        F: FnOnce(Leader<Result<T, WireError>>) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let abandoned = || Err(WireError::new(ErrorCode::Internal, format!("{what} was abandoned")));
        self.join(id, start, abandoned).await.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn many_concurrent_joins_run_one_fetch() {
        let flights: Arc<Flights<u32>> = Arc::default();
        static FETCHES: AtomicU32 = AtomicU32::new(0);
        let mut tasks = Vec::new();
        for _ in 0..64 {
            let flights = flights.clone();
            tasks.push(tokio::spawn(async move {
                flights
                    .join(
                        7,
                        |leader| async move {
                            FETCHES.fetch_add(1, Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            leader.publish(42);
                        },
                        || 0,
                    )
                    .await
            }));
        }
        let mut leaders = 0;
        for t in tasks {
            let (v, led) = t.await.unwrap();
            assert_eq!(v, 42);
            leaders += led as u32;
        }
        assert_eq!(FETCHES.load(Ordering::SeqCst), 1);
        assert_eq!(leaders, 1);
        assert!(flights.is_empty());
    }

    #[tokio::test]
    async fn a_leader_that_dies_releases_its_waiters() {
        let flights: Arc<Flights<u32>> = Arc::default();
        let (v, _) = flights.join(1, |leader| async move { drop(leader) }, || 99).await;
        assert_eq!(v, 99);
        assert!(flights.is_empty());
        let fallible: Arc<Flights<Result<u32, WireError>>> = Arc::default();
        let err = fallible.join_fallible(1, "the test fill", |leader| async move { drop(leader) }).await;
        let err = err.unwrap_err();
        assert_eq!((err.code, err.message.as_str()), (ErrorCode::Internal, "the test fill was abandoned"));
    }
}
