//! Where grammars compile: a small pool of threads of their own, each with a stack sized for
//! the deepest grammar the gateway's limits let through, and a time budget per compilation.
//!
//! llguidance compiles a grammar by recursion over its rules (a Lark chain of rules, a JSON
//! schema's `$ref`s), so a deep enough grammar overflows an ordinary thread's 2 MiB stack and
//! aborts the whole process. Here it runs on a [`COMPILE_STACK_BYTES`] stack (address space
//! reserved, touched only as deep as a grammar goes), never on the async runtime or the
//! engine thread. A compilation that has not finished within its budget (counted from when a
//! thread takes it) is answered as [`CompileError::Budget`]; its thread goes on until
//! llguidance returns (its own fuel limits bound that). A full queue, or a job that waited its
//! budget for a thread, answers [`CompileError::Busy`] (a retryable 503): contention never
//! turns into "send a smaller grammar".

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// The stack of each compile thread: 512 MiB of address space (pages are committed only as
/// deep as a grammar goes; an ordinary thread has 2 MiB).
pub const COMPILE_STACK_BYTES: usize = 512 << 20;

/// Why a grammar did not compile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CompileError {
    /// The grammar is wrong; the text says what is wrong with it.
    Invalid(String),
    /// It did not compile within the budget.
    Budget(Duration),
    /// Every compile thread is busy and the queue is full.
    Busy,
}

impl std::fmt::Display for CompileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CompileError::Invalid(e) => f.write_str(e),
            CompileError::Budget(d) => write!(
                f,
                "the grammar did not compile within {} ms; send a smaller grammar",
                d.as_millis()
            ),
            CompileError::Busy => f.write_str("every grammar compiler is busy"),
        }
    }
}

type Work = Box<dyn FnOnce() + Send>;

/// A job waits in the queue.
const QUEUED: u8 = 0;
/// A thread runs it.
const RUNNING: u8 = 1;
/// Its caller stopped waiting before a thread took it: it is skipped.
const ABANDONED: u8 = 2;

/// A job and whether a thread or its caller has claimed it.
struct Job {
    state: Arc<AtomicU8>,
    work: Work,
}

/// What a job tells its caller.
enum Progress<T> {
    Started,
    Done(Result<T, String>),
}

/// The compile threads and their bounded queue. Cheap to share (`Arc`).
pub struct CompilePool {
    tx: Mutex<SyncSender<Job>>,
    budget: Duration,
    queue_wait: Duration,
    /// Compilations of each tenant in the pool (queued or running, until the job ends).
    shares: Arc<Shares>,
    /// The most one tenant may have in the pool: half the threads, rounded up.
    per_tenant: usize,
}

/// Each tenant's compilations in the pool, and a signal when one ends.
#[derive(Default)]
struct Shares {
    held: Mutex<std::collections::HashMap<u32, usize>>,
    freed: Condvar,
}

/// One compilation's place in its tenant's share; given back when dropped (with the job,
/// when it ends or is skipped).
struct SharePlace {
    shares: Arc<Shares>,
    tenant: u32,
}

impl Drop for SharePlace {
    fn drop(&mut self) {
        let mut held = self
            .shares
            .held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(n) = held.get_mut(&self.tenant) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.tenant);
            }
        }
        self.shares.freed.notify_all();
    }
}

impl std::fmt::Debug for CompilePool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompilePool")
            .field("budget", &self.budget)
            .field("queue_wait", &self.queue_wait)
            .finish_non_exhaustive()
    }
}

impl CompilePool {
    /// `workers` threads, `queue` jobs waiting at most, `budget` per compilation counted from
    /// when a thread takes it; a job waits for a thread at most as long as its budget.
    pub fn new(workers: usize, queue: usize, budget: Duration) -> std::io::Result<Arc<Self>> {
        let (tx, rx) = mpsc::sync_channel::<Job>(queue);
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..workers.max(1) {
            let rx = rx.clone();
            std::thread::Builder::new()
                .name(format!("superinfer-grammar-{i}"))
                .stack_size(COMPILE_STACK_BYTES)
                .spawn(move || loop {
                    let job = match rx.lock() {
                        Ok(rx) => rx.recv(),
                        Err(_) => return,
                    };
                    let Ok(job) = job else { return };
                    // A job whose caller stopped waiting in the queue is not run.
                    let claimed = job.state.compare_exchange(
                        QUEUED,
                        RUNNING,
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    );
                    if claimed.is_ok() {
                        (job.work)();
                    }
                })?;
        }
        Ok(Arc::new(CompilePool {
            tx: Mutex::new(tx),
            budget,
            queue_wait: budget,
            shares: Arc::default(),
            per_tenant: workers.max(1).div_ceil(2),
        }))
    }

    /// [`CompilePool::run`] for `tenant`, who may have at most half the threads' worth of
    /// compilations in the pool (queued or running, an over-budget one until it ends): past
    /// that it waits for one of its own to end, at most the queue wait ([`CompileError::Busy`]
    /// past it), so one tenant's heavy grammars leave the other threads to the others.
    pub fn run_for<T: Send + 'static>(
        &self,
        tenant: u32,
        f: impl FnOnce() -> Result<T, String> + Send + 'static,
    ) -> Result<T, CompileError> {
        let place = self.take_share(tenant)?;
        self.run(move || {
            let _place = place;
            f()
        })
    }

    fn take_share(&self, tenant: u32) -> Result<SharePlace, CompileError> {
        let deadline = Instant::now() + self.queue_wait;
        let mut held = self
            .shares
            .held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        loop {
            let n = held.entry(tenant).or_insert(0);
            if *n < self.per_tenant {
                *n += 1;
                return Ok(SharePlace {
                    shares: self.shares.clone(),
                    tenant,
                });
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(CompileError::Busy);
            }
            held = self
                .shares
                .freed
                .wait_timeout(held, left)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
    }

    /// The budget of one compilation.
    pub fn budget(&self) -> Duration {
        self.budget
    }

    /// Runs `f` on a compile thread and waits for it: at most the queue wait for a thread
    /// ([`CompileError::Busy`] past it: the compilers were busy, not the grammar too big),
    /// then at most the budget from when the thread took it ([`CompileError::Budget`]).
    pub fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> Result<T, String> + Send + 'static,
    ) -> Result<T, CompileError> {
        let (reply, answer) = mpsc::sync_channel(2);
        let state = Arc::new(AtomicU8::new(QUEUED));
        let job = Job {
            state: state.clone(),
            work: Box::new(move || {
                let _ = reply.send(Progress::Started);
                let _ = reply.send(Progress::Done(f()));
            }),
        };
        let sent = match self.tx.lock() {
            Ok(tx) => tx.try_send(job),
            Err(_) => return Err(CompileError::Busy),
        };
        if sent.is_err() {
            return Err(CompileError::Busy);
        }
        let mut deadline = Instant::now() + self.queue_wait;
        let mut running = false;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match answer.recv_timeout(left) {
                Ok(Progress::Started) => {
                    running = true;
                    deadline = Instant::now() + self.budget;
                }
                Ok(Progress::Done(r)) => return r.map_err(CompileError::Invalid),
                Err(RecvTimeoutError::Timeout) if !running => {
                    let gave_up = state.compare_exchange(
                        QUEUED,
                        ABANDONED,
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    );
                    if gave_up.is_ok() {
                        return Err(CompileError::Busy);
                    }
                    // A thread took it just now: its budget starts.
                    running = true;
                    deadline = Instant::now() + self.budget;
                }
                Err(RecvTimeoutError::Timeout) => return Err(CompileError::Budget(self.budget)),
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(CompileError::Invalid(
                        "the grammar compiler failed on this grammar".into(),
                    ))
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Recurses `depth` levels with a 4 KiB frame each.
    fn deep(depth: usize) -> usize {
        let frame = std::hint::black_box([1u8; 4096]);
        if depth == 0 {
            return frame[0] as usize;
        }
        deep(depth - 1) + std::hint::black_box(frame[depth % 4096]) as usize
    }

    #[test]
    fn deep_recursion_runs_where_an_ordinary_thread_would_overflow() {
        let pool = CompilePool::new(1, 4, Duration::from_secs(20)).unwrap();
        // 4,000 frames of 4 KiB: 16 MiB, eight times an ordinary thread's stack.
        assert_eq!(pool.run(|| Ok(deep(4000))), Ok(4001));
    }

    /// Runs `f` until it answers something other than `Busy` (a queue that drains).
    fn until_served<T: Send + 'static>(
        pool: &CompilePool,
        f: impl Fn() -> Result<T, String> + Send + Sync + Clone + 'static,
    ) -> Result<T, CompileError> {
        for _ in 0..200 {
            match pool.run(f.clone()) {
                Err(CompileError::Busy) => std::thread::sleep(Duration::from_millis(10)),
                other => return other,
            }
        }
        panic!("the pool stayed busy for 2 s");
    }

    #[test]
    fn a_slow_job_answers_budget_and_a_full_queue_busy() {
        let budget = Duration::from_millis(50);
        let pool = CompilePool::new(1, 1, budget).unwrap();
        let (started_tx, started) = mpsc::channel::<()>();
        let (release, gate) = mpsc::channel::<()>();
        let gate = Arc::new(Mutex::new(gate));
        let p = pool.clone();
        let first = std::thread::spawn(move || {
            p.run(move || {
                started_tx.send(()).unwrap();
                gate.lock().unwrap().recv().unwrap();
                Ok(())
            })
        });
        started.recv().unwrap();
        // The worker is held; its one queue place fills with jobs nobody waits for long.
        let mut busy = false;
        for _ in 0..200 {
            if pool.run(|| Ok(())) == Err(CompileError::Busy) {
                busy = true;
                break;
            }
        }
        assert!(busy, "a held worker with a full queue answers Busy");
        assert_eq!(first.join().unwrap(), Err(CompileError::Budget(budget)));
        // A job that waits its budget for the held thread is Busy (retryable), not Budget.
        assert_eq!(pool.run(|| Ok(())), Err(CompileError::Busy));
        release.send(()).unwrap();
        // Jobs abandoned in the queue are skipped; the pool serves again.
        assert_eq!(
            until_served(&pool, || Err::<(), _>("bad".into())),
            Err(CompileError::Invalid("bad".into()))
        );
        assert_eq!(until_served(&pool, || Ok(7)), Ok(7));
    }

    /// The budget counts from when a thread takes the job: a job queued behind another for
    /// most of a budget still gets its whole budget to run.
    #[test]
    fn time_in_the_queue_is_not_charged_to_the_budget() {
        let budget = Duration::from_millis(400);
        let pool = CompilePool::new(1, 4, budget).unwrap();
        let (started_tx, started) = mpsc::channel::<()>();
        let p = pool.clone();
        let first = std::thread::spawn(move || {
            p.run(move || {
                started_tx.send(()).unwrap();
                std::thread::sleep(Duration::from_millis(250));
                Ok(1)
            })
        });
        started.recv().unwrap();
        let submitted = Instant::now();
        let second = pool.run(|| {
            std::thread::sleep(Duration::from_millis(250));
            Ok(2)
        });
        assert_eq!(second, Ok(2), "queued ~250 ms, ran ~250 ms");
        assert!(
            submitted.elapsed() > budget,
            "the wait and the run together pass the budget"
        );
        assert_eq!(first.join().unwrap(), Ok(1));
    }

    /// One tenant holding its share (here one of two threads) waits for its own job to end;
    /// another tenant takes the other thread at once.
    #[test]
    fn a_tenant_has_at_most_its_share_of_the_threads() {
        let pool = CompilePool::new(2, 8, Duration::from_secs(5)).unwrap();
        let (started_tx, started) = mpsc::channel::<()>();
        let (release, gate) = mpsc::channel::<()>();
        let gate = Arc::new(Mutex::new(gate));
        let p = pool.clone();
        let heavy = std::thread::spawn(move || {
            p.run_for(1, move || {
                started_tx.send(()).unwrap();
                gate.lock().unwrap().recv().unwrap();
                Ok(())
            })
        });
        started.recv().unwrap();
        // Tenant 2 gets the other thread now.
        assert_eq!(pool.run_for(2, || Ok(2)), Ok(2));
        // Tenant 1's second grammar waits for its first: past the queue wait it is Busy.
        let short = CompilePool {
            queue_wait: Duration::from_millis(50),
            tx: Mutex::new(pool.tx.lock().unwrap().clone()),
            budget: pool.budget,
            shares: pool.shares.clone(),
            per_tenant: pool.per_tenant,
        };
        assert_eq!(short.run_for(1, || Ok(1)), Err(CompileError::Busy));
        release.send(()).unwrap();
        assert_eq!(heavy.join().unwrap(), Ok(()));
        assert_eq!(pool.run_for(1, || Ok(1)), Ok(1));
    }
}
