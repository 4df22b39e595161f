//! The HTTP errors of requests the engine refused or failed, shared by the one-choice and
//! several-choice handlers and the streams.

use superinfer_engine::StreamErrorKind;

use crate::error::GatewayError;
use crate::generate::{EndError, Outcome};
use crate::metrics::Metrics;

/// The HTTP error of a request the engine refused at submission.
pub fn refusal_error(end: Outcome, metrics: &Metrics) -> GatewayError {
    match end.error {
        Some(err) => engine_failure(err, 0, metrics),
        None => GatewayError::Engine("the engine refused the request without a reason".into()),
    }
}

/// The engine refused or failed a request after admission, by the error's kind (never by
/// its text): the request's own fault (its grammar failed at run time) is a 400; a full
/// queue, a request that would miss its TTFT SLO, one shed at its queue deadline or a failed
/// step is overload (503 with Retry-After; the first three counted as shed); a stopped engine is a shutdown (503); a
/// failed engine, 503 while the process exits for its supervisor to restart it.
pub fn engine_failure(err: EndError, tokens: u32, metrics: &Metrics) -> GatewayError {
    let overloaded = |reason: Option<&'static str>| {
        if let (Some(reason), 0) = (reason, tokens) {
            metrics.shed(reason);
        }
        GatewayError::Overloaded {
            message: format!("{}; retry after the Retry-After seconds", err.message),
            retry_after_s: 1,
        }
    };
    match err.kind {
        StreamErrorKind::Request => {
            tracing::warn!(error = %err.message, "a request failed in the engine");
            GatewayError::bad_request(err.message)
        }
        StreamErrorKind::QueueFull => overloaded(Some("queue_full")),
        StreamErrorKind::WouldMissSlo => overloaded(Some("slo")),
        StreamErrorKind::QueueDeadline => overloaded(Some("deadline")),
        StreamErrorKind::StepFailed => overloaded(None),
        StreamErrorKind::Stopped => GatewayError::ShuttingDown,
        StreamErrorKind::EngineFailed => GatewayError::EngineFailed(err.message),
    }
}

#[cfg(test)]
mod tests {
    use super::engine_failure;
    use crate::error::GatewayError;
    use crate::generate::EndError;
    use crate::metrics::{Metrics, SHED};
    use superinfer_engine::EngineError;
    use superinfer_engine::StreamErrorKind;
    use superinfer_policies::RequestId;

    fn end(kind: StreamErrorKind, message: String) -> EndError {
        EndError { kind, message }
    }

    #[test]
    fn a_request_refused_for_its_slo_is_overload_not_a_fault() {
        let refused = EngineError::WouldMissSlo {
            id: RequestId(7),
            wait_s: 3.2,
        };
        let m = Metrics::new();
        assert!(matches!(
            engine_failure(
                end(StreamErrorKind::WouldMissSlo, refused.to_string()),
                0,
                &m
            ),
            GatewayError::Overloaded { .. }
        ));
        let full = EngineError::QueueFull(3).to_string();
        assert!(matches!(
            engine_failure(end(StreamErrorKind::QueueFull, full), 0, &m),
            GatewayError::Overloaded { .. }
        ));
        // The kind decides, not the words.
        let grammar = end(
            StreamErrorKind::Request,
            "structured output: stopped".into(),
        );
        assert!(matches!(
            engine_failure(grammar, 0, &m),
            GatewayError::InvalidRequest { .. }
        ));
        let failed = end(
            StreamErrorKind::EngineFailed,
            "the engine failed: boom".into(),
        );
        let e = engine_failure(failed, 0, &m);
        assert_eq!(e.status(), 503);
        let text = m.render(&Default::default(), "m");
        assert!(
            text.contains(&format!("{SHED}{{reason=\"slo\"}} 1")),
            "{text}"
        );
        assert!(
            text.contains(&format!("{SHED}{{reason=\"queue_full\"}} 1")),
            "{text}"
        );
    }
}
