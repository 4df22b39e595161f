//! Real-clock serving: [`spawn`] runs an [`Engine`] on its own OS thread; an [`EngineHandle`]
//! (cheap to clone) submits requests and gets one bounded event stream per request. Dropping
//! a [`RequestStream`] aborts its request; the engine frees its blocks within one iteration.
//!
//! Supervision: a panic anywhere in the serving loop (a step, a command, a grammar-mask worker
//! whose panic the step re-raises) is caught at the engine boundary. The engine is then
//! failed for good: [`EngineHandle::health`] says [`EngineHealth::Failed`] with the panic's
//! message, [`EngineHandle::panics`] counts it, every request in flight or still in the inbox
//! ends with `FinishReason::Error` and [`StreamErrorKind::EngineFailed`], later submits are
//! refused, one error is logged and the thread ends. The engine is not restarted in the
//! process: the runner holds the model weights and the KV pool, and its device state after a
//! panic cannot be trusted. The process should exit non-zero instead, so that its supervisor
//! (systemd `Restart=`, Kubernetes) starts a fresh one; the gateway does that once its health
//! endpoints answer 503 and the requests in flight have had their answers.

use crate::clock::Clock;
use crate::engine::{Engine, EngineEvent, EngineStats};
use crate::error::EngineError;
use crate::kv::PrefixHit;
use crate::request::{EngineRequest, ErrorCause, FinishReason};
use crate::runner::ModelRunner;
use crate::transfer::Transfer;
use std::collections::HashMap;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;
use superinfer_policies::RequestId;
use tokio::sync::mpsc as tmpsc;

/// How the serving loop behaves.
#[derive(Clone, Debug)]
pub struct HandleConfig {
    /// Submissions queued for the engine thread beyond this are refused (`QueueFull`).
    pub inbox_capacity: usize,
    /// How long an idle loop waits for work before looking again.
    pub idle_wait: Duration,
    /// Sleep for each step's reported time (a simulated runner on the real clock then serves
    /// at the profile's speed). Off: steps take only their real time.
    pub pace: bool,
    /// Histograms recorded after every step that ran; `None`: none.
    pub step_metrics: Option<StepMetrics>,
}

impl Default for HandleConfig {
    fn default() -> Self {
        HandleConfig {
            inbox_capacity: 4096,
            idle_wait: Duration::from_millis(5),
            pace: false,
            step_metrics: None,
        }
    }
}

/// Whether the engine thread serves ([`EngineHandle::health`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EngineHealth {
    /// Serving: submits are taken.
    Running,
    /// Shut down on purpose (or every handle's inbox sender went away).
    Stopped,
    /// The serving loop panicked; `message` is the panic's. The engine is not restarted in the
    /// process (the module docs say why).
    Failed { message: String },
}

enum Command {
    /// A request, its stream, and the signal that the engine accepted it (dropped unsent when
    /// the engine refused it: its stream then holds the error end).
    Submit(
        Box<EngineRequest>,
        tmpsc::Sender<StreamEvent>,
        tokio::sync::oneshot::Sender<()>,
    ),
    /// Drop a namespace's prefix cache; the blocks dropped are sent back.
    DropPrefixCache(String, tokio::sync::oneshot::Sender<u32>),
    Shutdown,
}

/// Submits requests to a running engine thread.
#[derive(Clone)]
pub struct EngineHandle {
    tx: SyncSender<Command>,
    shared: Arc<Shared>,
}

impl EngineHandle {
    /// Queues a request (its `id` is assigned here). Errors: the engine stopped, or its inbox
    /// is full (a gateway answers 503).
    pub fn submit(&self, mut req: EngineRequest) -> Result<RequestStream, EngineError> {
        if !self.shared.running.load(Ordering::Acquire) {
            return Err(EngineError::Stopped);
        }
        req.id = RequestId(self.shared.next_id.fetch_add(1, Ordering::Relaxed));
        let id = req.id;
        // Room for every token plus the end: the engine thread never blocks on a slow client.
        let cap = req.max_tokens.min(self.shared.max_tokens_total) as usize + 2;
        let (etx, erx) = tmpsc::channel(cap);
        let (atx, arx) = tokio::sync::oneshot::channel();
        match self.tx.try_send(Command::Submit(Box::new(req), etx, atx)) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => return Err(EngineError::QueueFull(0)),
            Err(TrySendError::Disconnected(_)) => return Err(EngineError::Stopped),
        }
        Ok(RequestStream::new(id, erx, arx, self.shared.clone()))
    }

    /// Drops the prefix cache of namespace `base` (a tenant's own, `CacheScope::tenant_base`,
    /// or a shared one; every salt of it) and returns the blocks dropped. Blocks in use by
    /// live requests stay until those let go, but no request hits them again.
    pub async fn drop_prefix_cache(&self, base: String) -> Result<u32, EngineError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        match self.tx.try_send(Command::DropPrefixCache(base, tx)) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => return Err(EngineError::QueueFull(0)),
            Err(TrySendError::Disconnected(_)) => return Err(EngineError::Stopped),
        }
        rx.await.map_err(|_| EngineError::Stopped)
    }

    /// Gauges and counters as of the last step. A panic while they were being published
    /// left them as they were before it, so they are read through the lock's poisoning.
    pub fn stats(&self) -> EngineStats {
        let stats = self.shared.stats.lock();
        stats.unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Whether the engine thread is serving (false once it stopped or failed).
    pub fn is_running(&self) -> bool {
        self.shared.running.load(Ordering::Acquire)
    }

    /// Whether the engine thread serves, stopped, or failed (and why).
    pub fn health(&self) -> EngineHealth {
        if self.is_running() {
            return EngineHealth::Running;
        }
        let failure = self.shared.failure.lock();
        match failure.unwrap_or_else(PoisonError::into_inner).clone() {
            Some(message) => EngineHealth::Failed { message },
            None => EngineHealth::Stopped,
        }
    }

    /// Panics caught in the serving loop (the first one fails the engine, so 0 or 1).
    pub fn panics(&self) -> u64 {
        self.shared.panics.load(Ordering::Relaxed)
    }
}

/// The engine thread's join handle; `shutdown` aborts what is left and stops the loop.
pub struct EngineThread {
    tx: SyncSender<Command>,
    join: Option<JoinHandle<()>>,
}

impl EngineThread {
    /// Stops the loop (live requests finish with `Abort`) and waits for the thread.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        let _ = self.tx.send(Command::Shutdown);
        if let Some(j) = self.join.take() {
            let _ = j.join();
        }
    }
}

impl Drop for EngineThread {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Starts serving `engine` on a dedicated thread.
pub fn spawn<R, T, C>(
    engine: Engine<R, T, C>,
    cfg: HandleConfig,
) -> Result<(EngineHandle, EngineThread), EngineError>
where
    R: ModelRunner + 'static,
    T: Transfer + 'static,
    C: Clock + 'static,
{
    let (tx, rx) = mpsc::sync_channel(cfg.inbox_capacity.max(1));
    let shared = Arc::new(Shared {
        stats: Mutex::new(engine.stats()),
        aborts: Mutex::new(Vec::new()),
        running: AtomicBool::new(true),
        failure: Mutex::new(None),
        panics: AtomicU64::new(0),
        next_id: AtomicU64::new(1),
        max_tokens_total: engine
            .config()
            .hbm_blocks
            .saturating_mul(engine.config().block_size),
    });
    let loop_shared = shared.clone();
    let join = std::thread::Builder::new()
        .name("superinfer-engine".into())
        .spawn(move || serve(engine, rx, loop_shared, cfg))
        .map_err(|e| EngineError::Config(format!("cannot start the engine thread: {e}")))?;
    Ok((
        EngineHandle {
            tx: tx.clone(),
            shared,
        },
        EngineThread {
            tx,
            join: Some(join),
        },
    ))
}

struct Loop<R, T, C> {
    engine: Engine<R, T, C>,
    /// Each live request's stream, and the prefix-cache hit its first token reported.
    streams: HashMap<RequestId, (tmpsc::Sender<StreamEvent>, PrefixHit)>,
    shared: Arc<Shared>,
    /// The events buffer handed back and forth with the engine (`Engine::swap_events`).
    events: Vec<EngineEvent>,
    #[cfg(feature = "fault-injection")]
    fault: fault::Fault,
}

fn serve<R: ModelRunner, T: Transfer, C: Clock>(
    engine: Engine<R, T, C>,
    rx: mpsc::Receiver<Command>,
    shared: Arc<Shared>,
    cfg: HandleConfig,
) {
    let mut l = Loop {
        engine,
        streams: HashMap::new(),
        shared,
        events: Vec::new(),
        #[cfg(feature = "fault-injection")]
        fault: fault::Fault::from_env(),
    };
    // The engine boundary: a panic in a turn fails the engine (the module docs say why it is
    // not restarted here). The engine is not touched again after one: its state may be
    // half-updated, and answering the requests needs only the streams.
    let panicked = loop {
        match panic::catch_unwind(AssertUnwindSafe(|| l.turn(&rx, &cfg))) {
            Ok(true) => {}
            Ok(false) => break None,
            Err(payload) => break Some(panic_message(payload.as_ref())),
        }
    };
    match panicked {
        Some(message) => l.fail_for_good(message, &rx),
        None => {
            l.shared.running.store(false, Ordering::Release);
            l.fail_all("the engine stopped", StreamErrorKind::Stopped);
        }
    }
}

/// The message of a panic's payload (`panic!` with a literal gives a `&str`, with format
/// arguments a `String`).
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_string()
    }
}

/// The end of a request that failed, its message `error` and its kind `kind`.
fn error_end(error: String, kind: StreamErrorKind) -> StreamEvent {
    StreamEvent::Finished {
        reason: FinishReason::Error,
        t: 0.0,
        prompt_tokens: 0,
        completion_tokens: 0,
        error: Some(error),
        error_kind: Some(kind),
        cached: PrefixHit::default(),
        trace: EndTrace::default(),
    }
}

impl<R: ModelRunner, T: Transfer, C: Clock> Loop<R, T, C> {
    /// One turn of the loop: the commands waiting (blocking briefly when the engine is
    /// idle), the aborts, one step and its events. `false`: stop serving.
    fn turn(&mut self, rx: &Receiver<Command>, cfg: &HandleConfig) -> bool {
        // Block only when there is nothing to do.
        if self.engine.is_empty() {
            match rx.recv_timeout(cfg.idle_wait) {
                Ok(cmd) => {
                    if !self.command(cmd) {
                        return false;
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return false,
            }
        }
        while let Ok(cmd) = rx.try_recv() {
            if !self.command(cmd) {
                return false;
            }
        }
        self.aborts();
        let mut pause = Duration::ZERO;
        let mut published = false;
        if !self.engine.is_empty() {
            #[cfg(feature = "fault-injection")]
            self.fault.before_step();
            let started = std::time::Instant::now();
            match self.engine.step() {
                Ok(report) => {
                    if let (Some(m), true) = (&cfg.step_metrics, report.ran) {
                        let wall = started.elapsed().as_secs_f64();
                        m.observe(&report, if cfg.pace { report.elapsed } else { wall });
                    }
                    // The gauges first: a client that sees its request finish and then reads
                    // the metrics must not find it still running.
                    self.publish_stats();
                    published = !self.route();
                    if cfg.pace && report.ran {
                        pause = Duration::from_secs_f64(report.elapsed);
                    } else if !report.ran {
                        pause = Duration::from_micros(200);
                    }
                }
                Err(e) => self.fail_all(&e.to_string(), StreamErrorKind::StepFailed),
            }
        }
        if !published {
            self.publish_stats();
        }
        if !pause.is_zero() {
            std::thread::sleep(pause);
        }
        true
    }

    /// The loop panicked with `message`: the engine is marked failed (before `running` turns
    /// false, so a handle that sees it stopped reads why), the panic counted and logged, and
    /// every request in flight or in the inbox ends with [`StreamErrorKind::EngineFailed`].
    /// Commands other than submits are dropped (a prefix-cache drop then reads `Stopped`).
    fn fail_for_good(&mut self, message: String, rx: &Receiver<Command>) {
        tracing::error!(
            panic = %message,
            requests = self.streams.len(),
            "the engine panicked: it serves nothing more and the process should be restarted"
        );
        self.shared.panics.fetch_add(1, Ordering::Relaxed);
        let error = format!("the engine failed: {message}");
        *self
            .shared
            .failure
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(message);
        self.shared.running.store(false, Ordering::Release);
        for (_, (tx, _)) in self.streams.drain() {
            let _ = tx.try_send(error_end(error.clone(), StreamErrorKind::EngineFailed));
        }
        // A submit that saw the engine running just before it failed may still come after
        // this; the receiver's drop then closes its stream without an end.
        while let Ok(cmd) = rx.try_recv() {
            if let Command::Submit(_, tx, _) = cmd {
                let _ = tx.try_send(error_end(error.clone(), StreamErrorKind::EngineFailed));
            }
        }
    }

    /// The gauges the handle reads (`EngineHandle::stats`), as of now.
    fn publish_stats(&self) {
        if let Ok(mut s) = self.shared.stats.lock() {
            *s = self.engine.stats();
        }
    }

    /// Handles one command; `false` means shut down.
    fn command(&mut self, cmd: Command) -> bool {
        match cmd {
            Command::Shutdown => false,
            Command::DropPrefixCache(base, tx) => {
                let _ = tx.send(self.engine.drop_prefix_cache(&base));
                self.publish_stats();
                true
            }
            Command::Submit(req, tx, accepted) => {
                let id = req.id;
                match self.engine.submit(*req) {
                    Ok(()) => {
                        self.streams.insert(id, (tx, PrefixHit::default()));
                        let _ = accepted.send(());
                    }
                    Err(e) => {
                        let kind = StreamErrorKind::of_refusal(&e);
                        let _ = tx.try_send(error_end(e.to_string(), kind));
                    }
                }
                true
            }
        }
    }

    fn aborts(&mut self) {
        let ids = match self.shared.aborts.lock() {
            Ok(mut a) => std::mem::take(&mut *a),
            Err(_) => return,
        };
        let mut waiting = HashMap::new();
        for (id, trace) in ids {
            self.streams.remove(&id);
            self.engine.abort(id);
            if let Some(tx) = trace {
                waiting.insert(id, tx);
            }
        }
        // The aborts' own Finished events go to no stream; their traces to whoever asked.
        for ev in self.engine.take_events() {
            if let EngineEvent::Finished { id, end, .. } = ev {
                if let Some(tx) = waiting.remove(&id) {
                    let _ = tx.send(EndTrace {
                        queued_s: end.queued_s,
                        preemptions: end.preemptions,
                        gpu_s: end.gpu_s,
                        mask_s: end.mask_s,
                    });
                }
            }
        }
    }

    /// Sends the step's events to their streams; returns whether it aborted a request whose
    /// client went away (the gauges changed since they were published).
    fn route(&mut self) -> bool {
        let mut aborted = false;
        let mut events = std::mem::take(&mut self.events);
        self.engine.swap_events(&mut events);
        for ev in events.drain(..) {
            match ev {
                EngineEvent::Token {
                    id,
                    token,
                    t,
                    extra,
                } => {
                    let gone = self.streams.get_mut(&id).is_some_and(|(tx, cached)| {
                        // A token without `extra` has the request's earlier `cached`.
                        let extra = extra.map(|x| *x).unwrap_or_default();
                        if extra.cached.tokens() > 0 {
                            *cached = extra.cached;
                        }
                        tx.try_send(StreamEvent::Token {
                            token,
                            t,
                            logprobs: extra.logprobs,
                            cached: *cached,
                            prompt_logprobs: extra.prompt_logprobs,
                        })
                        .is_err()
                    });
                    if gone {
                        // The client went away: abort now, frees its blocks before the next step.
                        self.streams.remove(&id);
                        self.engine.abort(id);
                        aborted = true;
                    }
                }
                EngineEvent::Finished { id, t, end } => {
                    if let Some((tx, _)) = self.streams.remove(&id) {
                        let failed = end.reason == FinishReason::Error;
                        let _ = tx.try_send(StreamEvent::Finished {
                            reason: end.reason,
                            t,
                            prompt_tokens: end.prompt_tokens,
                            completion_tokens: end.completion_tokens,
                            error: end.error,
                            error_kind: failed.then_some(match end.error_cause {
                                Some(ErrorCause::QueueDeadline) => StreamErrorKind::QueueDeadline,
                                _ => StreamErrorKind::Request,
                            }),
                            cached: end.cached,
                            trace: EndTrace {
                                queued_s: end.queued_s,
                                preemptions: end.preemptions,
                                gpu_s: end.gpu_s,
                                mask_s: end.mask_s,
                            },
                        });
                    }
                }
            }
        }
        self.events = events;
        aborted
    }

    /// Aborts every live request; each ends with error `msg` of kind `kind`.
    fn fail_all(&mut self, msg: &str, kind: StreamErrorKind) {
        let ids: Vec<RequestId> = self.streams.keys().copied().collect();
        for id in ids {
            self.engine.abort(id);
            if let Some((tx, _)) = self.streams.remove(&id) {
                let _ = tx.try_send(error_end(msg.to_string(), kind));
            }
        }
        let _ = self.engine.take_events();
    }
}

#[cfg(feature = "fault-injection")]
pub mod fault;
mod shared;

/// What a binary built with the test-only `fault-injection` feature must say at start-up
/// (cargo unifies features, so `cargo test --release`, `cargo bench -p superinfer-gateway`
/// or `cargo build --release --all-targets` build `target/release/superinfer` with it): the
/// variables that make it fail on purpose, and which of them are set. `None` in a build
/// without the feature.
pub fn fault_injection_notice() -> Option<String> {
    #[cfg(feature = "fault-injection")]
    {
        let set: Vec<&str> = [fault::PANIC_AT_STEP, fault::MASK_PANIC]
            .into_iter()
            .filter(|v| std::env::var_os(v).is_some())
            .collect();
        Some(format!(
            "this binary was built with the test-only fault-injection feature: {} and {} make \
             it panic on purpose (set now: {}); build the server alone for service \
             (cargo build --release -p superinfer-gateway)",
            fault::PANIC_AT_STEP,
            fault::MASK_PANIC,
            if set.is_empty() {
                "none".to_string()
            } else {
                set.join(", ")
            },
        ))
    }
    #[cfg(not(feature = "fault-injection"))]
    None
}
mod step_metrics;
mod stream;
use shared::Shared;
pub use step_metrics::StepMetrics;
pub use stream::{EndTrace, RequestStream, StreamErrorKind, StreamEvent};
#[cfg(test)]
mod tests;
