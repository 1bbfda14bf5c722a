//! The retry policy for origin requests: per-attempt deadlines sized for the request, capped
//! exponential backoff with full jitter, a bounded number of attempts, no retry for 403/404/412.

use std::fmt::Display;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::OriginConfig;
use crate::origin::request_log::RequestLog;
use crate::origin::OriginError;

/// What a request is, for the request log.
pub struct Label<'a> {
    pub op: &'static str,
    pub target: &'a (dyn Display + Sync),
}

#[derive(Debug, Clone)]
pub struct RetryPolicy {
    pub log: Option<Arc<RequestLog>>,
    pub max_attempts: u32,
    pub base: Duration,
    pub cap: Duration,
    pub fixed_allowance: Duration,
    pub min_throughput: u64,
}

impl RetryPolicy {
    pub fn from_config(cfg: &OriginConfig) -> RetryPolicy {
        RetryPolicy {
            log: None,
            max_attempts: cfg.max_attempts,
            base: Duration::from_millis(cfg.backoff_base_ms),
            cap: Duration::from_millis(cfg.backoff_max_ms),
            fixed_allowance: Duration::from_secs_f64(cfg.connect_timeout_secs + cfg.first_byte_timeout_secs),
            min_throughput: cfg.min_throughput,
        }
    }

    /// Deadline of one attempt that moves `bytes`: connect + first byte + the body at the slowest
    /// tolerated rate. (object_store's own timeout covers a whole body whatever its size; ours scales.)
    pub fn attempt_deadline(&self, bytes: u64) -> Duration {
        self.fixed_allowance + Duration::from_secs_f64(bytes as f64 / self.min_throughput as f64)
    }

    /// Sleep before attempt `n` (1-based retry count): uniform in [0, min(cap, base * 2^n)].
    pub fn backoff(&self, retry: u32) -> Duration {
        let exp = self.base.saturating_mul(1u32 << retry.min(20));
        let ceiling = exp.min(self.cap);
        ceiling.mul_f64(rand::random::<f64>())
    }

    /// Runs `op` until it succeeds, fails with a non-retryable error, or attempts run out. Each
    /// attempt is bounded by `attempt_deadline(bytes)`. `on_retry` is called before each retry.
    pub async fn run<T, F, Fut>(
        &self,
        label: Label<'_>,
        bytes: u64,
        mut on_retry: impl FnMut(),
        mut op: F,
    ) -> Result<T, OriginError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, OriginError>>,
    {
        let deadline = self.attempt_deadline(bytes);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let started = Instant::now();
            let err = match tokio::time::timeout(deadline, op()).await {
                Ok(Ok(v)) => {
                    if let Some(log) = &self.log {
                        log.record(label.op, label.target, attempt, "ok", started.elapsed());
                    }
                    return Ok(v);
                }
                Ok(Err(e)) => e,
                Err(_) => OriginError::Failed(format!("no complete answer within {deadline:?}")),
            };
            if let Some(log) = &self.log {
                log.record(label.op, label.target, attempt, &format!("error: {err}"), started.elapsed());
            }
            if !err.is_retryable() || attempt >= self.max_attempts {
                if attempt > 1 && err.is_retryable() {
                    // The inner text, not `err` itself, so the message does not say "failed" twice.
                    let what = match &err {
                        OriginError::Failed(m) => m.clone(),
                        other => other.to_string(),
                    };
                    return Err(OriginError::Failed(format!("{what} (gave up after {attempt} attempts)")));
                }
                return Err(err);
            }
            on_retry();
            tokio::time::sleep(self.backoff(attempt)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    fn label() -> Label<'static> {
        Label { op: "GET", target: &"s3://b/k" }
    }

    fn policy() -> RetryPolicy {
        RetryPolicy {
            log: None,
            max_attempts: 4,
            base: Duration::from_millis(1),
            cap: Duration::from_millis(4),
            fixed_allowance: Duration::from_millis(200),
            min_throughput: 1 << 20,
        }
    }

    #[tokio::test]
    async fn retries_transient_failures_then_succeeds() {
        let calls = AtomicU32::new(0);
        let out = policy()
            .run(
                label(),
                0,
                || {},
                || async {
                    if calls.fetch_add(1, Ordering::SeqCst) < 2 {
                        Err(OriginError::Failed("503 SlowDown".into()))
                    } else {
                        Ok(7)
                    }
                },
            )
            .await;
        assert_eq!(out.unwrap(), 7);
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn never_retries_not_found_stale_or_refused() {
        for err in [
            OriginError::NotFound("k".into()),
            OriginError::Stale("k".into()),
            OriginError::PermissionDenied("k".into()),
            OriginError::Credentials("expired".into()),
            OriginError::BadRequest("k".into()),
        ] {
            let calls = AtomicU32::new(0);
            let kind = std::mem::discriminant(&err);
            let err = std::sync::Mutex::new(Some(err));
            let out: Result<(), _> = policy()
                .run(
                    label(),
                    0,
                    || {},
                    || {
                        calls.fetch_add(1, Ordering::SeqCst);
                        let e = err.lock().unwrap().take().unwrap();
                        async move { Err(e) }
                    },
                )
                .await;
            assert_eq!(std::mem::discriminant(&out.unwrap_err()), kind);
            assert_eq!(calls.load(Ordering::SeqCst), 1);
        }
    }

    #[tokio::test]
    async fn gives_up_after_max_attempts_and_stalls_hit_the_deadline() {
        let calls = AtomicU32::new(0);
        let out: Result<(), _> = policy()
            .run(
                label(),
                0,
                || {},
                || async {
                    calls.fetch_add(1, Ordering::SeqCst);
                    std::future::pending::<()>().await;
                    Ok(())
                },
            )
            .await;
        assert!(matches!(out, Err(OriginError::Failed(ref m)) if m.contains("gave up after 4")), "{out:?}");
        assert_eq!(calls.load(Ordering::SeqCst), 4);
    }

    /// O1: the sleep before retry n is uniform in [0, min(cap, base * 2^n)]: it grows, stops at the
    /// cap, and is jittered (retries of many clients do not come back in step).
    #[test]
    fn backoff_is_exponential_capped_and_jittered() {
        let p = RetryPolicy { base: Duration::from_millis(10), cap: Duration::from_millis(300), ..policy() };
        for retry in 1..12u32 {
            let ceiling = Duration::from_millis(10 * (1 << retry)).min(p.cap);
            let samples: Vec<Duration> = (0..2000).map(|_| p.backoff(retry)).collect();
            let max = *samples.iter().max().unwrap();
            let mean = samples.iter().sum::<Duration>() / samples.len() as u32;
            let distinct: std::collections::BTreeSet<_> = samples.iter().collect();
            assert!(max <= ceiling, "retry {retry}: slept {max:?}, over {ceiling:?}");
            assert!(max >= ceiling.mul_f64(0.9), "retry {retry}: never near the ceiling {ceiling:?}");
            assert!(distinct.len() > 1000, "retry {retry}: no jitter");
            let half = ceiling / 2;
            assert!(mean > half.mul_f64(0.85) && mean < half.mul_f64(1.15), "retry {retry}: mean {mean:?}");
        }
    }

    #[test]
    fn deadline_scales_with_size_and_backoff_is_capped() {
        let p = policy();
        assert!(p.attempt_deadline(10 << 20) > p.attempt_deadline(1 << 20) + Duration::from_secs(8));
        for r in 0..30 {
            assert!(p.backoff(r) <= p.cap);
        }
    }
}
