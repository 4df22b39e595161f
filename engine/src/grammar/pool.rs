//! Where grammars compile: a small pool of threads of their own, each with a stack sized for
//! the deepest grammar the gateway's limits let through, and a time budget per compilation.
//!
//! llguidance compiles a grammar by recursion over its rules (a Lark chain of rules, a JSON
//! schema's `$ref`s), so a deep enough grammar overflows an ordinary thread's 2 MiB stack and
//! aborts the whole process. Here it runs on a [`COMPILE_STACK_BYTES`] stack (address space
//! reserved, touched only as deep as a grammar goes), never on the async runtime or the
//! engine thread. A compilation that has not finished within its budget is answered as
//! [`CompileError::Budget`]; its thread goes on until llguidance returns (its own fuel limits
//! bound that), so the pool's queue is bounded and a full pool answers [`CompileError::Busy`].

use std::sync::mpsc::{self, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
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

/// A job and the time after which nobody waits for it any more.
struct Job {
    deadline: Instant,
    work: Work,
}

/// The compile threads and their bounded queue. Cheap to share (`Arc`).
pub struct CompilePool {
    tx: Mutex<SyncSender<Job>>,
    budget: Duration,
}

impl std::fmt::Debug for CompilePool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompilePool")
            .field("budget", &self.budget)
            .finish_non_exhaustive()
    }
}

impl CompilePool {
    /// `workers` threads, `queue` jobs waiting at most, `budget` per compilation.
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
                    // Nobody waits for a job whose budget ran out while it was queued.
                    if Instant::now() < job.deadline {
                        (job.work)();
                    }
                })?;
        }
        Ok(Arc::new(CompilePool {
            tx: Mutex::new(tx),
            budget,
        }))
    }

    /// The budget of one compilation.
    pub fn budget(&self) -> Duration {
        self.budget
    }

    /// Runs `f` on a compile thread and waits for it, at most the budget.
    pub fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> Result<T, String> + Send + 'static,
    ) -> Result<T, CompileError> {
        let (reply, answer) = mpsc::sync_channel(1);
        let job = Job {
            deadline: Instant::now() + self.budget,
            work: Box::new(move || {
                let _ = reply.send(f());
            }),
        };
        let sent = match self.tx.lock() {
            Ok(tx) => tx.try_send(job),
            Err(_) => return Err(CompileError::Busy),
        };
        match sent {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                return Err(CompileError::Busy)
            }
        }
        match answer.recv_timeout(self.budget) {
            Ok(r) => r.map_err(CompileError::Invalid),
            Err(RecvTimeoutError::Timeout) => Err(CompileError::Budget(self.budget)),
            // The job was skipped (its budget ran out in the queue) or its thread panicked.
            Err(RecvTimeoutError::Disconnected) => Err(CompileError::Budget(self.budget)),
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
        release.send(()).unwrap();
        // Jobs whose budget ran out in the queue are skipped; the pool serves again.
        assert_eq!(
            until_served(&pool, || Err::<(), _>("bad".into())),
            Err(CompileError::Invalid("bad".into()))
        );
        assert_eq!(until_served(&pool, || Ok(7)), Ok(7));
    }
}
