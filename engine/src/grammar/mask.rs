//! A step's token masks, computed on a CPU worker while the model runs.
//!
//! The engine knows every constrained request's tokens up to step N before step N+1 starts,
//! so the masks of step N+1 do not depend on its forward pass. [`MaskBoard::compute`] runs
//! the matchers of the step's constrained rows on a worker thread (many rows in parallel on
//! rayon's pool) while the runner runs the model; the runner then waits for a row's mask
//! ([`MaskRef::wait`]) only after its logits exist, and applies it before sampling. A batch
//! without constrained requests spawns nothing.
//!
//! A matcher that fails, or panics, fails its own row only: the engine ends that request
//! with the row's error ([`MaskBoard::failures`]) and the rest of the batch goes on. A panic
//! must not reach the step's `thread::scope`, which would re-raise it on the engine thread and
//! fail the whole engine for one request's grammar.

use llguidance::toktrie::SimpleVob;
use llguidance::Matcher;
use rayon::prelude::*;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

/// The tokens a grammar allows next.
#[derive(Clone, Debug)]
pub struct TokenMask(pub(crate) SimpleVob);

impl TokenMask {
    /// Sets every disallowed token's logit to −∞ (tokens past the mask's vocabulary too).
    pub fn apply(&self, logits: &mut [f32]) {
        let n = self.0.len().min(logits.len());
        for (i, l) in logits[..n].iter_mut().enumerate() {
            if !self.0.is_allowed(i as u32) {
                *l = f32::NEG_INFINITY;
            }
        }
        for l in &mut logits[n..] {
            *l = f32::NEG_INFINITY;
        }
    }

    /// Allowed tokens.
    pub fn allowed(&self) -> usize {
        self.0.num_set()
    }

    pub fn is_allowed(&self, token: u32) -> bool {
        (token as usize) < self.0.len() && self.0.is_allowed(token)
    }
}

/// One mask per batch row that has a matcher; `Err` when the matcher failed (the engine then
/// ends the request with that error after the step).
type Masks = Vec<Option<Result<TokenMask, String>>>;

/// Up to this many masks are computed one after another on the worker thread.
const SEQUENTIAL_MASKS: usize = 4;

/// Where a step's masks arrive.
pub struct MaskBoard {
    rx: Mutex<Receiver<(Masks, Vec<f64>)>>,
    done: OnceLock<(Masks, Vec<f64>)>,
}

impl std::fmt::Debug for MaskBoard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MaskBoard")
            .field("ready", &self.done.get().is_some())
            .finish()
    }
}

impl MaskBoard {
    /// A board and the sender its worker answers on.
    pub fn new() -> (MaskBoard, MaskSender) {
        let (tx, rx) = sync_channel(1);
        let board = MaskBoard {
            rx: Mutex::new(rx),
            done: OnceLock::new(),
        };
        (board, MaskSender(tx))
    }

    /// The worker's job: the mask of each row that has a matcher (`rows[i]`: batch row `i`'s
    /// matcher, if any).
    pub fn compute(rows: Vec<Option<&mut Matcher>>, tx: MaskSender) {
        MaskBoard::compute_with(rows, tx, |m| {
            #[cfg(feature = "fault-injection")]
            if crate::handle::fault::mask_panics() {
                panic!("injected fault: a grammar-mask panic");
            }
            m.compute_mask().map(TokenMask).map_err(|e| e.to_string())
        })
    }

    /// [`MaskBoard::compute`] with `mask` computing one row's mask: a panic in it becomes
    /// that row's error.
    pub(crate) fn compute_with<M, F>(rows: Vec<Option<M>>, tx: MaskSender, mask: F)
    where
        M: Send,
        F: Fn(M) -> Result<TokenMask, String> + Sync,
    {
        // Each row's mask and the seconds it took (the CPU time its tenant is charged).
        let one = |m: Option<M>| match m {
            None => (None, 0.0),
            Some(m) => {
                let t = Instant::now();
                let r = catch_unwind(AssertUnwindSafe(|| mask(m))).unwrap_or_else(|_| {
                    Err("the grammar engine failed on this request's grammar".into())
                });
                (Some(r), t.elapsed().as_secs_f64())
            }
        };
        // A few masks: on this thread alone, beside the forward pass's threads; many: also
        // on rayon's pool (which the forward pass uses too, so they share the cores).
        let constrained = rows.iter().filter(|m| m.is_some()).count();
        let done: (Masks, Vec<f64>) = if constrained <= SEQUENTIAL_MASKS {
            rows.into_iter().map(one).unzip()
        } else {
            rows.into_par_iter().map(one).unzip()
        };
        // The runner may have failed and dropped the board: nothing waits then.
        let _ = tx.0.send(done);
    }

    /// Of `rows` (a row and what it stands for, e.g. its request), those whose mask failed,
    /// with why; called once the worker is done.
    pub fn failures<K>(&self, rows: impl IntoIterator<Item = (usize, K)>) -> Vec<(K, String)> {
        rows.into_iter()
            .filter_map(|(row, k)| (MaskRef { board: self, row }).wait().err().map(|e| (k, e)))
            .collect()
    }

    /// Seconds row `row`'s mask took on the worker (0 for a row without a matcher), waiting
    /// for the worker.
    pub fn seconds(&self, row: usize) -> f64 {
        self.masks().1.get(row).copied().unwrap_or(0.0)
    }

    fn masks(&self) -> &(Masks, Vec<f64>) {
        self.done.get_or_init(|| {
            let rx = self.rx.lock().expect("the receiver is only read here");
            // A worker that died sends nothing: every row then reports an error below.
            rx.recv().unwrap_or_default()
        })
    }

    /// Row `row`'s mask, waiting for the worker. `None`: the row has no matcher.
    fn get(&self, row: usize) -> Option<&Result<TokenMask, String>> {
        match self.masks().0.get(row) {
            Some(m) => m.as_ref(),
            None => Some(&WORKER_GONE),
        }
    }
}

static WORKER_GONE: Result<TokenMask, String> = Err(String::new());

/// The worker's end of a [`MaskBoard`].
pub struct MaskSender(SyncSender<(Masks, Vec<f64>)>);

/// A batch row's place on its step's board.
#[derive(Clone, Copy, Debug)]
pub struct MaskRef<'a> {
    pub board: &'a MaskBoard,
    pub row: usize,
}

impl<'a> MaskRef<'a> {
    /// The row's mask (waiting for the worker if it is still computing), or why there is none.
    pub fn wait(&self) -> Result<&'a TokenMask, String> {
        match self.board.get(self.row) {
            Some(Ok(m)) => Ok(m),
            Some(Err(e)) if e.is_empty() => Err("the mask worker stopped".into()),
            Some(Err(e)) => Err(e.clone()),
            None => Err("no matcher for this row".into()),
        }
    }

    /// Applies the mask to a row of logits; when there is none (the matcher failed), the
    /// row is left as it is and the engine ends the request with the matcher's error.
    pub fn apply(&self, logits: &mut [f32]) {
        if let Ok(m) = self.wait() {
            m.apply(logits);
        }
    }
}
