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
use futures_util::stream;
use std::convert::Infallible;

use super::response::{event, ChunkKind, ResponseMeta, Usage, DONE};
use crate::generate::{Generation, Piece};
use crate::validate::Endpoint;

enum State {
    Open(Generation),
    Running(Generation),
    /// Events computed but not yet sent, then the end.
    Tail(Vec<Bytes>),
}

pub fn respond(gen: Generation, meta: ResponseMeta) -> Response {
    let first = match meta.endpoint {
        Endpoint::Chat => State::Open(gen),
        Endpoint::Completions if meta.echo.is_some() => State::Open(gen),
        Endpoint::Completions => State::Running(gen),
    };
    let events = stream::unfold((first, meta), |(state, meta)| async move {
        match state {
            State::Open(gen) => {
                // Chat: the role; completions with `echo`: the prompt's text.
                let b = match &meta.echo {
                    Some(prompt) if meta.endpoint == Endpoint::Completions => {
                        meta.chunk(ChunkKind::Text(prompt, &[]))
                    }
                    _ => meta.chunk(ChunkKind::Open),
                };
                Some((Ok::<_, Infallible>(b), (State::Running(gen), meta)))
            }
            State::Running(mut gen) => match gen.next().await {
                Some(Piece::Text(t)) => {
                    let lp = gen.take_logprobs();
                    let live = meta
                        .continuous_usage
                        .then(|| Usage::new(gen.prompt_tokens(), gen.completion_tokens()));
                    let b = meta.chunk_with(ChunkKind::Text(&t, &lp), live);
                    Some((Ok(b), (State::Running(gen), meta)))
                }
                Some(Piece::Done(o)) => {
                    let mut tail = Vec::with_capacity(3);
                    match o.error {
                        Some(err) => {
                            let e = super::engine_failure(err, o.completion_tokens);
                            tail.push(event(&serde_json::to_vec(&e.body()).unwrap_or_default()));
                        }
                        None => {
                            let live = meta
                                .continuous_usage
                                .then(|| Usage::new(o.prompt_tokens, o.completion_tokens));
                            tail.push(meta.chunk_with(ChunkKind::Finish(o.finish_reason), live));
                        }
                    }
                    if meta.include_usage {
                        let usage = Usage::new(o.prompt_tokens, o.completion_tokens);
                        tail.push(meta.chunk(ChunkKind::Usage(usage)));
                    }
                    tail.push(Bytes::from_static(DONE));
                    tail.reverse();
                    let b = tail.pop()?;
                    Some((Ok(b), (State::Tail(tail), meta)))
                }
                None => None,
            },
            State::Tail(mut rest) => {
                let b = rest.pop()?;
                Some((Ok(b), (State::Tail(rest), meta)))
            }
        }
    });
    let mut resp = Response::new(Body::from_stream(events));
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}
