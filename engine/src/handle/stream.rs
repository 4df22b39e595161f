//! [`RequestStream`]: one request's events, its acceptance signal, and the abort on drop.

use super::{Shared, StreamEvent};
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
                a.push(self.id);
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
