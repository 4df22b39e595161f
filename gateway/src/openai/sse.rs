//! Streamed answers as server-sent events: `data: {chunk}` per piece of text, a chunk with the
//! `finish_reason` (with `continuous_usage_stats`, each carries the usage so far; with `echo`,
//! a completion's first chunk is the prompt), a usage chunk when `stream_options.include_usage` is set, then
//! `data: [DONE]`. A failure after the headers went out is sent as `data: {"error": …}`
//! before `[DONE]`. If the client goes away, hyper drops the body, which drops the
//! [`Generation`] and with it the engine stream: the request is aborted.

use axum::body::Body;
use axum::http::{header, HeaderValue};
use axum::response::Response;
use bytes::Bytes;
use futures_util::{stream, Stream, StreamExt};
use std::convert::Infallible;
use tokio::sync::mpsc;
use tokio::sync::mpsc::error::SendTimeoutError;

use super::response::{event, ChunkKind, ResponseMeta, Usage, DONE};
use crate::config::StreamLimits;
use crate::conn::ConnKill;
use crate::generate::{Generation, Piece};
use crate::metrics::Metrics;
use crate::validate::Endpoint;

enum State {
    Open(Generation),
    Running(Generation),
    /// Events computed but not yet sent, then the end.
    Tail(Vec<Bytes>),
}

/// Where a stream's events go and what it may use.
pub struct Out {
    pub metrics: Metrics,
    pub limits: StreamLimits,
    /// Closes the connection (absent when the router is driven without a connection).
    pub kill: Option<ConnKill>,
}

/// The streamed answer. A task moves the events into a bounded buffer that the body reads;
/// when the client stops reading and the buffer stays full for `stall_timeout`, the task
/// drops the [`Generation`] (the engine aborts the request and frees its KV blocks), counts a
/// `slow_reader` abort and closes the connection.
pub fn respond(gen: Generation, meta: ResponseMeta, out: Out) -> Response {
    let events = events(gen, meta, out.metrics.clone());
    respond_with(events, out)
}

/// Any stream of SSE events through the bounded buffer and its slow-reader abort (also
/// `openai/several.rs`'s interleaved choices).
pub fn respond_with(events: impl Stream<Item = Bytes> + Send + 'static, out: Out) -> Response {
    let (tx, rx) = mpsc::channel::<Bytes>(out.limits.buffer.max(1));
    tokio::spawn(produce(events, tx, out));
    let body = stream::unfold(rx, |mut rx| async move {
        let b = rx.recv().await?;
        Some((Ok::<_, Infallible>(b), rx))
    });
    let mut resp = Response::new(Body::from_stream(body));
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

async fn produce(events: impl Stream<Item = Bytes>, tx: mpsc::Sender<Bytes>, out: Out) {
    futures_util::pin_mut!(events);
    loop {
        let next = tokio::select! {
            biased;
            // The client went away (hyper dropped the body): drop the generation now.
            () = tx.closed() => return,
            e = events.next() => e,
        };
        let Some(b) = next else { return };
        if b.is_empty() {
            // A piece of text held back (a tool call not yet complete).
            continue;
        }
        match tx.send_timeout(b, out.limits.stall_timeout).await {
            Ok(()) => {}
            Err(SendTimeoutError::Timeout(_)) => {
                out.metrics.stream_aborted("slow_reader");
                tracing::debug!(
                    "a stream's client read nothing for {:?}; aborting it",
                    out.limits.stall_timeout
                );
                if let Some(k) = &out.kill {
                    k.close();
                }
                return;
            }
            Err(SendTimeoutError::Closed(_)) => return,
        }
    }
}

fn events(gen: Generation, meta: ResponseMeta, metrics: Metrics) -> impl Stream<Item = Bytes> {
    let first = match meta.endpoint {
        Endpoint::Chat => State::Open(gen),
        Endpoint::Completions if meta.echo.is_some() => State::Open(gen),
        Endpoint::Completions => State::Running(gen),
    };
    stream::unfold((first, meta), move |(state, meta)| {
        let metrics = metrics.clone();
        async move {
            match state {
                State::Open(gen) => {
                    // Chat: the role; completions with `echo`: the prompt's text.
                    let b = match &meta.echo {
                        Some(prompt) if meta.endpoint == Endpoint::Completions => {
                            meta.chunk(ChunkKind::Text(prompt, &[]))
                        }
                        _ => meta.chunk(ChunkKind::Open),
                    };
                    Some((b, (State::Running(gen), meta)))
                }
                State::Running(mut gen) => match gen.next().await {
                    Some(Piece::Text(t)) => {
                        let lp = gen.take_logprobs();
                        let live = meta.continuous_usage.then(|| Usage::live(&gen));
                        let b = match &meta.tools {
                            None => meta.chunk_with(ChunkKind::Text(&t, &lp), live),
                            Some(ts) => {
                                let events = ts.borrow_mut().push(&t);
                                tool_chunks(&meta, events, lp, live)
                            }
                        };
                        Some((b, (State::Running(gen), meta)))
                    }
                    Some(Piece::Done(mut o)) => {
                        let mut tail = Vec::with_capacity(5);
                        let usage = Usage::of(&o);
                        // Entries of tokens whose text never came out (the last token decoded
                        // to nothing, e.g. end-of-text generated past with `ignore_eos`; with
                        // tools, text that became calls) go out with no text.
                        let lp = gen.take_logprobs();
                        let held = match &meta.tools {
                            None => lp,
                            Some(ts) => {
                                let events = ts.borrow_mut().finish();
                                tail.push(tool_chunks(&meta, events, lp, None));
                                if meta.called() && o.error.is_none() {
                                    o.finish_reason = "tool_calls";
                                }
                                std::mem::take(&mut *meta.held_logprobs.borrow_mut())
                            }
                        };
                        if !held.is_empty() {
                            tail.push(meta.chunk_with(ChunkKind::Text("", &held), None));
                        }
                        match o.error.take() {
                            Some(err) => {
                                let e = super::errors::engine_failure(
                                    err,
                                    o.completion_tokens,
                                    &metrics,
                                );
                                tail.push(event(
                                    &serde_json::to_vec(&e.body()).unwrap_or_default(),
                                ));
                            }
                            None => {
                                let live = meta.continuous_usage.then_some(usage);
                                tail.push(
                                    meta.chunk_with(ChunkKind::Finish(o.finish_reason), live),
                                );
                            }
                        }
                        if meta.include_usage {
                            tail.push(meta.chunk(ChunkKind::Usage(usage)));
                        }
                        tail.push(Bytes::from_static(DONE));
                        tail.reverse();
                        let b = tail.pop()?;
                        Some((b, (State::Tail(tail), meta)))
                    }
                    None => None,
                },
                State::Tail(mut rest) => {
                    let b = rest.pop()?;
                    Some((b, (State::Tail(rest), meta)))
                }
            }
        }
    })
}

/// The chunks of what a tool stream let out (content, calls and their pieces), as one piece of the
/// body; empty while it holds text back. The log-probabilities `lp` of the tokens behind it,
/// with those held from before, go with the first content; without content they stay held
/// (`ResponseMeta::held_logprobs`).
fn tool_chunks(
    meta: &ResponseMeta,
    events: Vec<crate::tools::ToolStreamEvent>,
    lp: Vec<crate::generate::TokenLogprob>,
    live: Option<Usage>,
) -> Bytes {
    use crate::tools::ToolStreamEvent;
    let mut out = Vec::new();
    let mut held = meta.held_logprobs.borrow_mut();
    held.extend(lp);
    for e in events {
        let b = match &e {
            ToolStreamEvent::Content(c) if c.is_empty() => continue,
            ToolStreamEvent::Content(c) => {
                let b = meta.chunk_with(ChunkKind::Text(c, &held), live);
                held.clear();
                b
            }
            ToolStreamEvent::Call(call) => meta.chunk_with(ChunkKind::Call(call), live),
            ToolStreamEvent::CallStart(call) => meta.chunk_with(ChunkKind::CallStart(call), live),
            ToolStreamEvent::CallArgs(piece) => meta.chunk_with(ChunkKind::CallArgs(piece), live),
        };
        out.extend_from_slice(&b);
    }
    Bytes::from(out)
}
