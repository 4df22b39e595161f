//! [`RequestStream`]: one request's events, its acceptance signal, and the abort on drop.

pub use super::shared::EndTrace;
use super::shared::Shared;
use crate::error::EngineError;
use crate::kv::PrefixHit;
use crate::request::FinishReason;
use crate::sampling::TokenLogprobs;
use std::sync::Arc;
use superinfer_policies::RequestId;
use tokio::sync::{mpsc as tmpsc, oneshot};

/// The events of one request. Dropping it before `Finished` aborts the request.
pub struct RequestStream {
    pub id: RequestId,
    rx: tmpsc::Receiver<StreamEvent>,
    accepted: Option<oneshot::Receiver<()>>,
    shared: Arc<Shared>,
    done: bool,
}

impl RequestStream {
    /// Waits until the engine took the request in (`true`) or refused it (`false`: queue
    /// full, it would miss its SLO, an option the engine lacks, the engine stopped or failed;
    /// the next event is then the error end). Within one engine step of the submit, so a
    /// server can answer a refusal with an HTTP error before the first byte of a stream.
    pub async fn accepted(&mut self) -> bool {
        match self.accepted.take() {
            Some(rx) => rx.await.is_ok(),
            None => true,
        }
    }

    /// Aborts the request (as dropping the stream does) and answers with its end's trace
    /// once the engine has ended it: the GPU time, queue time and preemptions of a request
    /// ended by a stop string or a client that left are recorded like any other's. The
    /// receiver errs if the request had already ended or the engine stopped.
    pub fn abort(mut self) -> oneshot::Receiver<EndTrace> {
        let (tx, rx) = oneshot::channel();
        if !self.done {
            self.done = true;
            if let Ok(mut a) = self.shared.aborts.lock() {
                a.push((self.id, Some(tx)));
            }
        }
        rx
    }

    /// The engine's id of its request.
    pub fn id(&self) -> RequestId {
        self.id
    }

    /// The next event; `None` after the stream ended (or the engine stopped).
    pub async fn next(&mut self) -> Option<StreamEvent> {
        let ev = self.rx.recv().await;
        self.note(&ev);
        ev
    }

    /// [`RequestStream::accepted`] for threads outside an async runtime.
    pub fn blocking_accepted(&mut self) -> bool {
        match self.accepted.take() {
            Some(rx) => rx.blocking_recv().is_ok(),
            None => true,
        }
    }

    /// Blocking variant for threads outside an async runtime.
    pub fn blocking_next(&mut self) -> Option<StreamEvent> {
        let ev = self.rx.blocking_recv();
        self.note(&ev);
        ev
    }

    fn note(&mut self, ev: &Option<StreamEvent>) {
        if matches!(ev, Some(StreamEvent::Finished { .. }) | None) {
            self.done = true;
        }
    }
}

impl Drop for RequestStream {
    fn drop(&mut self) {
        if !self.done {
            if let Ok(mut a) = self.shared.aborts.lock() {
                a.push((self.id, None));
            }
        }
    }
}

impl RequestStream {
    pub(super) fn new(
        id: RequestId,
        rx: tmpsc::Receiver<StreamEvent>,
        accepted: oneshot::Receiver<()>,
        shared: Arc<Shared>,
    ) -> RequestStream {
        RequestStream {
            id,
            rx,
            accepted: Some(accepted),
            shared,
            done: false,
        }
    }
}

/// What a request's stream yields.
#[derive(Clone, Debug, PartialEq)]
pub enum StreamEvent {
    /// A token, at engine time `t` (seconds since the engine started), with its
    /// log-probabilities when the request asked for them (`SamplingParams::logprobs`).
    Token {
        token: u32,
        t: f64,
        logprobs: Option<TokenLogprobs>,
        /// Prompt tokens found in the prefix cache (as `Finished`'s).
        cached: PrefixHit,
        /// With the first token of a request with `SamplingParams::prompt_logprobs`: the
        /// scores of prompt tokens `1..`.
        prompt_logprobs: Vec<TokenLogprobs>,
    },
    /// The end (always the last event).
    Finished {
        reason: FinishReason,
        t: f64,
        prompt_tokens: u32,
        completion_tokens: u32,
        /// With `FinishReason::Error`: what went wrong, for people (logs, the error body).
        error: Option<String>,
        /// With `FinishReason::Error` (and only then): whose fault it was, for programs, so a
        /// caller picks its answer without reading `error`.
        error_kind: Option<StreamErrorKind>,
        /// Prompt tokens found in the prefix cache (`usage.prompt_tokens_details`).
        cached: PrefixHit,
        /// How its life went inside the engine (for traces and logs).
        trace: EndTrace,
    },
}

/// Why a request ended with `FinishReason::Error` ([`StreamEvent::Finished`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamErrorKind {
    /// Something of this request's own: the engine refused it (an empty prompt, one too long
    /// for HBM, an option the runner lacks), or its model step or grammar failed. The engine
    /// serves on.
    Request,
    /// The engine's queue was full when the request reached it. The request itself was
    /// fine; it may be tried again (as may the next three).
    QueueFull,
    /// It would have waited past its TTFT SLO (`shed_late`).
    WouldMissSlo,
    /// It was still waiting for its first admission at its queue deadline
    /// (`EngineRequest::queue_deadline_s`), and was shed. The request itself was fine.
    QueueDeadline,
    /// The engine shut down.
    Stopped,
    /// A step failed as a whole (every request in it ends so).
    StepFailed,
    /// The engine failed (a panic in its loop) and serves nothing more
    /// ([`EngineHealth::Failed`]). The request itself was fine.
    EngineFailed,
}

impl StreamErrorKind {
    /// The kind of an error with which the engine refused a submitted request.
    pub(super) fn of_refusal(e: &EngineError) -> StreamErrorKind {
        match e {
            EngineError::QueueFull(_) => StreamErrorKind::QueueFull,
            EngineError::WouldMissSlo { .. } => StreamErrorKind::WouldMissSlo,
            EngineError::Stopped => StreamErrorKind::Stopped,
            _ => StreamErrorKind::Request,
        }
    }
}
