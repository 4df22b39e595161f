//! One admitted request's life after admission: engine events → text pieces (detokenized, cut
//! at stop strings) → the end, with per-tenant metrics and statistics recorded on the way.
//! Dropping a [`Generation`] before its end drops the engine stream, which aborts the request
//! in the engine (a client that went away frees its KV blocks).

pub use superinfer_engine::text::StopMatcher;

use std::sync::Arc;
use std::time::Instant;
use superinfer_engine::kv::PrefixHit;
use superinfer_engine::{FinishReason, RequestStream, StreamErrorKind, StreamEvent};

mod trace;

use crate::metrics::UNSERVED_REASONS;
use crate::quota::InFlight;
use crate::registry::TenantCtx;
use crate::text::Decoder;
use crate::usage::{ChoiceEnd, UsageTicket};

/// What the choices of one admitted request share: its concurrency slot and the seats of its
/// other sequences (freed when the last choice ends), and its entry in the usage ledger
/// (recorded once for the request).
pub struct Admitted {
    pub slot: InFlight,
    pub seats: Option<InFlight>,
    pub usage: UsageTicket,
}

/// What a generation yields.
#[derive(Clone, Debug, PartialEq)]
pub enum Piece {
    /// Text to append to the answer (never empty).
    Text(String),
    /// The end; always the last piece.
    Done(Outcome),
}

/// One token's log-probability with its most likely alternatives, as text.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    pub token: TokenText,
    pub logprob: f32,
    pub top: Vec<(TokenText, f32)>,
}

/// A token's text alone, and the bytes it stands for (not the text's where the token holds
/// part of a multi-byte character: the text is then U+FFFD).
#[derive(Clone, Debug, PartialEq)]
pub struct TokenText {
    pub text: String,
    pub bytes: Vec<u8>,
}

impl TokenText {
    fn of(d: &Decoder, token: u32) -> TokenText {
        let (text, bytes) = d.token_text_and_bytes(token);
        TokenText { text, bytes }
    }
}

impl TokenLogprob {
    /// The engine's report `lp` for token `token`, with the tokens' texts.
    fn of(d: &Decoder, token: u32, lp: &superinfer_engine::TokenLogprobs) -> TokenLogprob {
        TokenLogprob {
            token: TokenText::of(d, token),
            logprob: lp.logprob,
            top: lp
                .top
                .iter()
                .map(|&(t, p)| (TokenText::of(d, t), p))
                .collect(),
        }
    }
}

/// How a request ended.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    /// `stop`, `length`, `abort` or `error` (OpenAI's `finish_reason`).
    pub finish_reason: &'static str,
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    /// Set when the engine failed or refused the request.
    pub error: Option<EndError>,
    /// Prompt tokens found in the prefix cache, by tier.
    pub cached: PrefixHit,
}

/// Why a request ended in an error: whose fault (typed, for the HTTP answer) and what
/// happened (for people).
#[derive(Clone, Debug, PartialEq)]
pub struct EndError {
    pub kind: StreamErrorKind,
    pub message: String,
}

/// Streams one request's text.
pub struct Generation {
    stream: Option<RequestStream>,
    decoder: Decoder,
    stop: StopMatcher,
    ctx: Arc<TenantCtx>,
    started: Instant,
    last_token: Option<Instant>,
    gaps: Vec<f64>,
    prompt_tokens: u32,
    tokens: u32,
    /// The prefix-cache hit, as the engine reports it with each token and the end.
    cached: PrefixHit,
    pending_done: Option<Outcome>,
    /// The first piece, read ahead by [`Generation::before_first_piece`].
    held: Option<Piece>,
    /// Inside [`Generation::before_first_piece`]: an end in an error now is answered with an
    /// HTTP error, so its client receives no token and none is billed.
    unsent_on_error: bool,
    finished: bool,
    /// Log-probabilities of tokens not yet reported (when the request asked for them).
    logprobs: Vec<TokenLogprob>,
    /// Scores of prompt tokens `1..` (`echo` with `logprobs`), as the first token brought them.
    prompt_logprobs: Vec<TokenLogprob>,
    /// The prompt's ids, when its tokens are scored ([`Generation::scoring_prompt`]).
    scored_prompt: Vec<u32>,
    /// The request's concurrency slot and usage, shared by the choices of one request.
    share: Arc<Admitted>,
    /// A later choice of a prompt whose first choice bills the prompt's tokens.
    shares_prompt: bool,
    /// The engine refused the request at submission ([`Generation::refusal`]).
    refused: bool,
    trace: trace::RequestTrace,
    /// The end trace of an aborted engine request, still to come.
    late_trace: Option<tokio::sync::oneshot::Receiver<superinfer_engine::EndTrace>>,
}

impl Generation {
    /// `started` is when the request arrived at the gateway (TTFT is measured from it).
    pub fn new(
        stream: RequestStream,
        decoder: Decoder,
        stop: StopMatcher,
        ctx: Arc<TenantCtx>,
        started: Instant,
        prompt_tokens: u32,
        share: Arc<Admitted>,
    ) -> Generation {
        Generation {
            trace: trace::RequestTrace::new(&ctx.tenant.name, stream.id().0),
            late_trace: None,
            stream: Some(stream),
            decoder,
            stop,
            ctx,
            started,
            last_token: None,
            gaps: Vec::new(),
            prompt_tokens,
            tokens: 0,
            cached: PrefixHit::default(),
            pending_done: None,
            held: None,
            unsent_on_error: false,
            finished: false,
            logprobs: Vec::new(),
            prompt_logprobs: Vec::new(),
            scored_prompt: Vec::new(),
            share,
            shares_prompt: false,
            refused: false,
        }
    }

    /// Waits for the answer's first piece (text, or the end) and keeps it for [`next`]; an
    /// end in an error before any token is returned instead (with `next` then done), so a
    /// stream that sends its headers only after this answers a request shed at its queue
    /// deadline, or failed, with the HTTP error a non-streamed request gets (503 with
    /// Retry-After for overload) rather than a 200 and an error event.
    ///
    /// [`next`]: Generation::next
    pub async fn before_first_piece(&mut self) -> Option<Outcome> {
        self.unsent_on_error = true;
        let first = self.next().await;
        self.unsent_on_error = false;
        match first? {
            Piece::Done(o) if o.error.is_some() && o.completion_tokens == 0 => Some(o),
            piece => {
                self.held = Some(piece);
                None
            }
        }
    }

    /// Waits until the engine took the request in (`None`) or refused it: then its end,
    /// recorded like any end, for the server to answer with an HTTP error rather than start a
    /// stream (`RequestStream::accepted`).
    pub async fn refusal(&mut self) -> Option<Outcome> {
        if self.stream.as_mut()?.accepted().await {
            return None;
        }
        self.refused = true;
        match self.next().await {
            Some(Piece::Done(o)) => Some(o),
            _ => None,
        }
    }

    /// Marks a later choice of a prompt (`n` > 1, `best_of` > 1): its ledger entry holds its
    /// completion tokens only, as its `usage` does (`Usage::of_choice`).
    pub fn sharing_prompt(mut self, shares: bool) -> Generation {
        self.shares_prompt = shares;
        self
    }

    /// The request scores its prompt (`echo` with `logprobs`), whose ids are `prompt`.
    pub fn scoring_prompt(mut self, prompt: &[u32]) -> Generation {
        self.scored_prompt = prompt.to_vec();
        self
    }

    /// The prompt's tokens with their scores (the first has none, so it is not here: entry
    /// `k` is token `k + 1`'s), once the first token arrived.
    pub fn take_prompt_logprobs(&mut self) -> Vec<TokenLogprob> {
        std::mem::take(&mut self.prompt_logprobs)
    }

    /// The next piece; `None` after `Done`.
    pub async fn next(&mut self) -> Option<Piece> {
        if let Some(piece) = self.held.take() {
            return Some(piece);
        }
        if let Some(done) = self.pending_done.take() {
            return Some(self.done(done));
        }
        loop {
            let stream = self.stream.as_mut()?;
            let event = stream.next().await;
            match event {
                Some(StreamEvent::Token {
                    token,
                    logprobs,
                    cached,
                    prompt_logprobs,
                    ..
                }) => {
                    self.cached = cached;
                    self.on_token();
                    let d = &self.decoder;
                    if let Some(lp) = logprobs {
                        self.logprobs.push(TokenLogprob::of(d, token, &lp));
                    }
                    if !prompt_logprobs.is_empty() {
                        // Entry `k` scores prompt token `k + 1`.
                        self.prompt_logprobs = prompt_logprobs
                            .iter()
                            .zip(self.scored_prompt.iter().skip(1))
                            .map(|(lp, &t)| TokenLogprob::of(d, t, lp))
                            .collect();
                    }
                    let piece = self.decoder.push(token);
                    let cut = self.stop.push(&piece);
                    let (emit, stopped) = (cut.text, cut.stopped);
                    if stopped {
                        self.abort();
                        let done = self.outcome("stop", None);
                        return Some(self.emit_then(emit, done));
                    }
                    if !emit.is_empty() {
                        return Some(Piece::Text(emit));
                    }
                }
                Some(StreamEvent::Finished {
                    reason,
                    prompt_tokens,
                    completion_tokens,
                    error,
                    error_kind,
                    cached,
                    trace,
                    ..
                }) => {
                    self.stream = None;
                    self.trace.engine = trace;
                    if cached.tokens() > 0 || error.is_none() {
                        self.cached = cached;
                    }
                    if prompt_tokens > 0 {
                        self.prompt_tokens = prompt_tokens;
                    }
                    self.tokens = self.tokens.max(completion_tokens);
                    let error = error.map(|message| EndError {
                        kind: error_kind.unwrap_or(StreamErrorKind::StepFailed),
                        message,
                    });
                    let mut done = self.outcome(finish_reason(reason), error);
                    let tail = self.decoder.finish();
                    let cut = self.stop.push(&tail);
                    let (mut rest, stopped) = (cut.text, cut.stopped);
                    if stopped {
                        done.finish_reason = "stop";
                    } else {
                        rest.push_str(&self.stop.finish());
                    }
                    return Some(self.emit_then(rest, done));
                }
                None => {
                    self.stream = None;
                    let stopped = EndError {
                        kind: StreamErrorKind::Stopped,
                        message: "the engine stopped".into(),
                    };
                    let done = self.outcome("error", Some(stopped));
                    return Some(self.emit_then(String::new(), done));
                }
            }
        }
    }

    /// Log-probabilities of the tokens since the last call (empty unless requested). Call
    /// after each [`Piece::Text`]: its tokens' entries are here.
    pub fn take_logprobs(&mut self) -> Vec<TokenLogprob> {
        std::mem::take(&mut self.logprobs)
    }

    /// Tokens of the prompt.
    pub fn prompt_tokens(&self) -> u32 {
        self.prompt_tokens
    }

    /// Tokens generated so far.
    pub fn completion_tokens(&self) -> u32 {
        self.tokens
    }

    /// Prompt tokens found in the prefix cache (known from the first token on).
    pub fn cached_tokens(&self) -> u32 {
        self.cached.tokens()
    }

    fn emit_then(&mut self, text: String, done: Outcome) -> Piece {
        if text.is_empty() {
            self.done(done)
        } else {
            self.pending_done = Some(done);
            Piece::Text(text)
        }
    }

    fn outcome(&self, finish_reason: &'static str, error: Option<EndError>) -> Outcome {
        Outcome {
            finish_reason,
            prompt_tokens: self.prompt_tokens,
            completion_tokens: self.tokens,
            error,
            cached: self.cached,
        }
    }

    fn on_token(&mut self) {
        let now = Instant::now();
        let t = &self.ctx.tenant;
        match self.last_token {
            None => {
                let ttft = now.duration_since(self.started).as_secs_f64();
                self.trace.first_token(ttft, self.cached.tokens());
                self.ctx.metrics.ttft.record(ttft);
                let att = self.ctx.stats.first_token(ttft, t.slo.ttft_s());
                self.ctx.metrics.ttft_attainment.set(att);
                self.ctx.metrics.slo_checks[0].increment(1);
                self.ctx.metrics.slo_met[0].increment(u64::from(ttft <= t.slo.ttft_s()));
            }
            Some(last) => {
                let gap = now.duration_since(last).as_secs_f64();
                self.ctx.metrics.itl.record(gap);
                self.gaps.push(gap);
            }
        }
        self.last_token = Some(now);
        self.tokens += 1;
    }

    /// Records the end once and hands it out.
    fn done(&mut self, outcome: Outcome) -> Piece {
        let unserved = match outcome.error.as_ref().map(|e| e.kind) {
            None => "aborted",
            Some(StreamErrorKind::QueueFull | StreamErrorKind::WouldMissSlo) => "shed",
            Some(StreamErrorKind::QueueDeadline) => "deadline",
            Some(StreamErrorKind::Stopped) => "stopped",
            Some(StreamErrorKind::StepFailed | StreamErrorKind::EngineFailed) => "failed",
            Some(StreamErrorKind::Request) => "invalid",
        };
        self.record_end(outcome.finish_reason, outcome.error.is_some(), unserved);
        Piece::Done(outcome)
    }

    /// The end's metrics, statistics and ledger entry; `error`: the client gets an error
    /// answer instead of a `usage`; `unserved`: why, if it ended without a first token (one
    /// of `metrics::UNSERVED_REASONS`): then it is a TTFT miss.
    /// Aborts the engine request (a stop string, or its client gone); its end's trace comes
    /// back from the engine later and is recorded then ([`Generation::end_trace`]).
    fn abort(&mut self) {
        if let Some(stream) = self.stream.take() {
            self.late_trace = Some(stream.abort());
        }
    }

    /// Writes the end of the request's trace and records its GPU time: now, or once the
    /// engine has ended an aborted request (its queue time, preemptions and GPU share are
    /// known only then).
    fn end_trace(&mut self, reason: &'static str, unserved: Option<&'static str>) {
        let tokens = (self.prompt_tokens, self.tokens);
        let e2e_s = self.started.elapsed().as_secs_f64();
        let gpu = (!self.refused).then(|| self.ctx.metrics.clone());
        let mut trace = self.trace.clone();
        let finish = move |trace: &trace::RequestTrace| {
            trace.end(reason, tokens, e2e_s, unserved);
            if let Some(m) = gpu {
                m.gpu_seconds.record(trace.engine.gpu_s);
                if trace.engine.mask_s > 0.0 {
                    m.host_seconds[1].record(trace.engine.mask_s);
                }
            }
        };
        match (
            self.late_trace.take(),
            tokio::runtime::Handle::try_current(),
        ) {
            (Some(late), Ok(rt)) => {
                rt.spawn(async move {
                    if let Ok(engine) = late.await {
                        trace.engine = engine;
                    }
                    finish(&trace);
                });
            }
            _ => finish(&trace),
        }
    }

    fn record_end(&mut self, reason: &'static str, error: bool, unserved: &'static str) {
        if self.finished {
            return;
        }
        self.finished = true;
        self.end_trace(reason, self.last_token.is_none().then_some(unserved));
        if self.last_token.is_none() {
            let m = &self.ctx.metrics;
            let att = self
                .ctx
                .stats
                .unserved(self.started.elapsed().as_secs_f64());
            m.ttft_attainment.set(att);
            m.slo_checks[0].increment(1);
            let at = UNSERVED_REASONS.iter().position(|r| *r == unserved);
            m.ttft_unserved[at.unwrap_or(0)].increment(1);
        }
        // The same numbers as the answer's `usage` (`Usage::of` of this end's outcome).
        let (prompt, cached) = if self.shares_prompt {
            (0, 0)
        } else {
            (self.prompt_tokens, self.cached.tokens())
        };
        // As `before_first_piece` decides: an error end before any token is answered with an
        // HTTP error (one after tokens whose text was held back, by a partial stop string or
        // character, is streamed as usual and billed).
        if self.unsent_on_error && (error || reason == "error") && self.tokens == 0 {
            self.share.usage.fail();
        }
        self.share.usage.end(ChoiceEnd {
            prompt_tokens: prompt,
            cached_tokens: cached,
            completion_tokens: self.tokens,
            error: error || reason == "error",
            refused: self.refused,
        });
        let m = &self.ctx.metrics;
        let i = match reason {
            "stop" => 0,
            "length" => 1,
            "abort" => 2,
            _ => 3,
        };
        m.finished[i].increment(1);
        m.generation_tokens.increment(u64::from(self.tokens));
        // Admitted requests only: the engine looks the prompt up when it admits it.
        if self.last_token.is_some() || self.cached.tokens() > 0 {
            m.prefix_query_tokens
                .increment(u64::from(self.prompt_tokens));
            m.prefix_hit_tokens[0].increment(u64::from(self.cached.hbm));
            m.prefix_hit_tokens[1].increment(u64::from(self.cached.dram));
        }
        let e2e = self.started.elapsed().as_secs_f64();
        m.e2e.record(e2e);
        if !self.gaps.is_empty() {
            let slo_s = self.ctx.tenant.slo.tbt_s();
            let att = self.ctx.stats.gaps(&self.gaps, slo_s);
            m.tbt_attainment.set(att);
            let met = self.gaps.iter().filter(|g| **g <= slo_s).count();
            m.slo_checks[1].increment(self.gaps.len() as u64);
            m.slo_met[1].increment(met as u64);
        }
        self.ctx.stats.finished(u64::from(self.tokens), e2e);
    }
}

impl Drop for Generation {
    fn drop(&mut self) {
        // A client that went away: the engine request is aborted.
        self.abort();
        self.record_end("abort", false, "aborted");
    }
}

fn finish_reason(r: FinishReason) -> &'static str {
    match r {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
        FinishReason::Abort => "abort",
        FinishReason::Error => "error",
    }
}
