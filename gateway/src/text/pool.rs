//! The text pool: parsing, tokenization and chat templating run here, on tokio's blocking
//! threads, never on the reactor, so a request with a long prompt delays no other request's
//! I/O (`/healthz`, streams, other tenants).
//!
//! It is bounded and has its own admission:
//! - at most `workers` jobs run at once (the CPU they may take);
//! - at most `workers + queue` jobs are in the pool, running or waiting; beyond that a
//!   request is refused at once with 503 and `Retry-After`;
//! - one tenant may hold at most half of those places (429 beyond), and run at most half of
//!   the workers (rounded up), so one tenant's long prompts leave room for the others;
//! - a job for a body of [`LONG_BODY_BYTES`] or more runs on a thread of its own at the lowest
//!   CPU priority (nice 19 on Linux), so on a busy machine the reactor, the engine and other
//!   requests' short jobs run first and a long prompt takes only the CPU nobody else wants.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::{GatewayError, Result};

/// The longest a job waits for a worker. Past it the request is refused with a retryable 503
/// (`Retry-After`): the wait was the pool's contention, not the request's own cost.
pub const QUEUE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Bodies of at least this many bytes are tokenized at the lowest CPU priority (a 64 KiB
/// prompt takes ~15 ms to tokenize; shorter jobs are not worth a thread of their own).
pub const LONG_BODY_BYTES: usize = 64 * 1024;

/// Lowers the calling thread's CPU priority to the lowest (Linux keeps a nice value per
/// thread). Unprivileged processes cannot raise it again, so only threads that end after
/// their job call this.
fn lowest_priority() {
    // A failure (e.g. a seccomp filter) leaves the priority as it was, which is harmless.
    #[cfg(target_os = "linux")]
    let _ = rustix::process::setpriority_process(Some(rustix::thread::gettid()), 19);
}

/// The pool's size: running jobs and waiting places.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TextPoolConfig {
    pub workers: usize,
    pub queue: usize,
}

impl Default for TextPoolConfig {
    fn default() -> Self {
        TextPoolConfig {
            workers: std::thread::available_parallelism().map_or(2, |n| n.get()),
            queue: 64,
        }
    }
}

/// A bounded pool for CPU-heavy text work.
#[derive(Debug)]
pub struct TextPool {
    config: TextPoolConfig,
    /// Places in the pool (running or waiting).
    places: Arc<Semaphore>,
    /// Workers.
    running: Arc<Semaphore>,
    tenants: Mutex<HashMap<u32, Arc<TenantShare>>>,
    /// The longest a job waits for a worker ([`QUEUE_WAIT`]).
    queue_wait: std::time::Duration,
}

/// One tenant's share of the pool.
#[derive(Debug)]
struct TenantShare {
    places: Arc<Semaphore>,
    running: Arc<Semaphore>,
}

impl TextPool {
    pub fn new(config: TextPoolConfig) -> TextPool {
        let workers = config.workers.max(1);
        let config = TextPoolConfig {
            workers,
            queue: config.queue,
        };
        TextPool {
            config,
            places: Arc::new(Semaphore::new(workers + config.queue)),
            running: Arc::new(Semaphore::new(workers)),
            tenants: Mutex::new(HashMap::new()),
            queue_wait: QUEUE_WAIT,
        }
    }

    /// The pool with another longest wait for a worker.
    pub fn with_queue_wait(mut self, wait: std::time::Duration) -> TextPool {
        self.queue_wait = wait;
        self
    }

    pub fn config(&self) -> TextPoolConfig {
        self.config
    }

    /// Jobs in the pool now, running or waiting.
    pub fn in_pool(&self) -> usize {
        self.config.workers + self.config.queue - self.places.available_permits()
    }

    fn share(&self, tenant: u32) -> Arc<TenantShare> {
        let mut map = self.tenants.lock().unwrap_or_else(PoisonError::into_inner);
        let c = self.config;
        map.entry(tenant)
            .or_insert_with(|| {
                Arc::new(TenantShare {
                    places: Arc::new(Semaphore::new(((c.workers + c.queue) / 2).max(1))),
                    running: Arc::new(Semaphore::new(c.workers.div_ceil(2))),
                })
            })
            .clone()
    }

    /// Runs `job` for `tenant` on a blocking thread, or refuses it at once when the pool (503)
    /// or the tenant's share of it (429) is full. The places are held until the job ends,
    /// also when the caller stops waiting (a client that went away).
    pub async fn run<T: Send + 'static>(
        &self,
        tenant: u32,
        job: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T> {
        self.run_sized(tenant, 0, job).await
    }

    /// [`Self::run`] for a job over a body of `bytes` (long ones run at the lowest priority).
    pub async fn run_sized<T: Send + 'static>(
        &self,
        tenant: u32,
        bytes: usize,
        job: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T> {
        let share = self.share(tenant);
        let c = self.config;
        let tenant_place =
            share
                .places
                .clone()
                .try_acquire_owned()
                .map_err(|_| GatewayError::RateLimited {
                    message: format!(
                        "this tenant has too many requests being tokenized (at most {} of the \
                     pool's {} places); retry after the Retry-After seconds",
                        ((c.workers + c.queue) / 2).max(1),
                        c.workers + c.queue
                    ),
                    retry_after_s: 1,
                })?;
        let place =
            self.places
                .clone()
                .try_acquire_owned()
                .map_err(|_| GatewayError::Overloaded {
                    message: format!(
                        "the tokenizer pool is full ({} running, {} waiting); retry after the \
                     Retry-After seconds",
                        c.workers, c.queue
                    ),
                    retry_after_s: 1,
                })?;
        let workers = async {
            let tenant_worker = acquire(&share.running).await?;
            let worker = acquire(&self.running).await?;
            Ok::<_, GatewayError>((tenant_worker, worker))
        };
        let (tenant_worker, worker) = tokio::time::timeout(self.queue_wait, workers)
            .await
            .map_err(|_| GatewayError::Overloaded {
                message: format!(
                    "the tokenizer pool had no worker free for {} s; retry after the \
                     Retry-After seconds",
                    self.queue_wait.as_secs_f64()
                ),
                retry_after_s: 1,
            })??;
        let held: [OwnedSemaphorePermit; 4] = [tenant_place, place, tenant_worker, worker];
        if bytes < LONG_BODY_BYTES {
            return tokio::task::spawn_blocking(move || {
                let out = job();
                drop(held);
                out
            })
            .await
            .map_err(|e| GatewayError::Internal(format!("a tokenizer job failed: {e}")));
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name("superinfer-text-long".into())
            .spawn(move || {
                lowest_priority();
                let out = job();
                drop(held);
                let _ = tx.send(out);
            })
            .map_err(|e| GatewayError::Internal(format!("cannot start a tokenizer thread: {e}")))?;
        rx.await
            .map_err(|_| GatewayError::Internal("a tokenizer job failed".into()))
    }
}

async fn acquire(s: &Arc<Semaphore>) -> Result<OwnedSemaphorePermit> {
    s.clone()
        .acquire_owned()
        .await
        .map_err(|_| GatewayError::Internal("the tokenizer pool is closed".into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    fn pool(workers: usize, queue: usize) -> Arc<TextPool> {
        Arc::new(TextPool::new(TextPoolConfig { workers, queue }))
    }

    /// Starts a job that blocks until `release` is sent; returns once it holds its places.
    async fn blocked(
        p: &Arc<TextPool>,
        tenant: u32,
    ) -> (mpsc::Sender<()>, tokio::task::JoinHandle<Result<()>>) {
        let (tx, rx) = mpsc::channel::<()>();
        let before = p.in_pool();
        let p2 = p.clone();
        let h = tokio::spawn(async move { p2.run(tenant, move || rx.recv().unwrap_or(())).await });
        while p.in_pool() == before {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        (tx, h)
    }

    #[cfg(target_os = "linux")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn long_bodies_are_tokenized_at_the_lowest_priority_and_short_ones_are_not() {
        let p = pool(2, 4);
        let nice = || {
            let me = rustix::thread::gettid();
            let name = std::thread::current().name().map(str::to_owned);
            (
                name,
                rustix::process::getpriority_process(Some(me)).unwrap(),
            )
        };
        let base = nice().1;
        let (name, long) = p.run_sized(0, LONG_BODY_BYTES, nice).await.unwrap();
        assert_eq!(name.as_deref(), Some("superinfer-text-long"));
        assert_eq!(long, 19);
        let (_, short) = p.run_sized(0, LONG_BODY_BYTES - 1, nice).await.unwrap();
        assert_eq!(short, base, "a short job keeps the normal priority");
        // The places of the long job were returned.
        assert_eq!(p.in_pool(), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_full_pool_refuses_at_once_and_frees_its_places() {
        let p = pool(2, 2);
        let mut held = Vec::new();
        for tenant in [1, 1, 2, 2] {
            held.push(blocked(&p, tenant).await);
        }
        assert_eq!(p.in_pool(), 4);
        let e = p.run(3, || ()).await.unwrap_err();
        assert_eq!(e.status(), 503, "{e}");
        assert!(e.to_string().contains("tokenizer pool is full"), "{e}");
        for (tx, h) in held {
            tx.send(()).unwrap();
            h.await.unwrap().unwrap();
        }
        assert_eq!(p.in_pool(), 0);
        assert_eq!(p.run(3, || 7).await.unwrap(), 7);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_tenant_gets_half_the_pool_and_others_still_run() {
        let p = pool(2, 6);
        let mut held = Vec::new();
        for _ in 0..4 {
            held.push(blocked(&p, 1).await);
        }
        let e = p.run(1, || ()).await.unwrap_err();
        assert_eq!(e.status(), 429, "{e}");
        // Tenant 1 runs on one worker; its other jobs wait; tenant 2 gets the other worker.
        let other = tokio::time::timeout(Duration::from_secs(10), p.run(2, || 5)).await;
        assert_eq!(
            other
                .expect("tenant 2 is not stuck behind tenant 1")
                .unwrap(),
            5
        );
        for (tx, h) in held {
            tx.send(()).unwrap();
            h.await.unwrap().unwrap();
        }
    }

    /// A job that waits past the queue wait for a worker is a retryable 503, and runs not.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_job_waiting_past_the_queue_wait_is_a_retryable_503() {
        let p = Arc::new(
            TextPool::new(TextPoolConfig {
                workers: 1,
                queue: 4,
            })
            .with_queue_wait(Duration::from_millis(100)),
        );
        let (release, held) = blocked(&p, 1).await;
        let ran = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let r = ran.clone();
        let e = p
            .run(2, move || {
                r.store(true, std::sync::atomic::Ordering::Release)
            })
            .await
            .unwrap_err();
        assert_eq!(e.status(), 503, "{e}");
        assert!(e.to_string().contains("no worker free"), "{e}");
        release.send(()).unwrap();
        held.await.unwrap().unwrap();
        assert!(!ran.load(std::sync::atomic::Ordering::Acquire));
        assert!(p.run(2, || 7).await.is_ok());
    }
}
