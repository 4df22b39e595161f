//! Structured outputs through the engine on the CPU model path (the tiny random-weight model,
//! whose unconstrained text is noise): the grammar alone decides what the answer can be, so
//! every constrained answer must match it, end with `Stop` when the grammar is complete (also
//! with `ignore_eos`), and the masks of constrained rows must leave the other rows of the
//! batch exactly as they are without them.

use std::collections::BTreeMap;
use superinfer_engine::grammar::{GrammarCompiler, GrammarSpec};
use superinfer_engine::model::tiny::write_tiny_model;
use superinfer_engine::serve::{cpu_engine, CpuEngine, EngineOptions};
use superinfer_engine::{EngineEvent, EngineRequest, FinishReason, SamplingParams, TextCodec};
use superinfer_policies::{RequestId, Slo, TenantId};

fn request(id: u64, prompt: Vec<u32>, max_tokens: u32, sampling: SamplingParams) -> EngineRequest {
    EngineRequest {
        slo: Slo {
            ttft_s: 1.0,
            tbt_s: 1.0,
        },
        ignore_eos: true,
        sampling,
        ..EngineRequest::new(RequestId(id), TenantId(0), prompt, max_tokens)
    }
}

/// Every request's tokens and finish reason.
fn drain(e: &mut CpuEngine) -> BTreeMap<RequestId, (Vec<u32>, FinishReason)> {
    let mut tokens: BTreeMap<RequestId, Vec<u32>> = BTreeMap::new();
    let mut out = BTreeMap::new();
    while !e.is_empty() {
        e.step().expect("step");
        for ev in e.take_events() {
            match ev {
                EngineEvent::Token { id, token, .. } => tokens.entry(id).or_default().push(token),
                EngineEvent::Finished { id, end, .. } => {
                    out.insert(id, (tokens.remove(&id).unwrap_or_default(), end.reason));
                }
            }
        }
    }
    out
}

fn engine(dir: &std::path::Path) -> CpuEngine {
    let opts = EngineOptions {
        hbm_blocks: Some(256),
        dram_blocks: Some(64),
        seed: Some(3),
        ..EngineOptions::default()
    };
    cpu_engine(dir, &opts).expect("tiny engine").0
}

#[test]
fn constrained_answers_match_their_grammars_and_leave_their_neighbours_alone() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model(dir.path(), 9).unwrap();
    let codec = TextCodec::from_model_dir(dir.path()).unwrap();
    let compiler = GrammarCompiler::new(&codec, None).unwrap();
    let grammars = [
        GrammarSpec::Regex("[0-9]{3}-[a-z]{2}".into()),
        GrammarSpec::Choice(vec!["alpha".into(), "beta gamma".into()]),
        GrammarSpec::JsonSchema(serde_json::json!({
            "type": "object",
            "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99},
                           "ok": {"type": "boolean"}},
            "required": ["n", "ok"], "additionalProperties": false})),
    ];
    let prompt = |i: u64| {
        codec
            .encode(&format!("request number {i} says"), true)
            .unwrap()
    };
    let free = |i: u64| {
        let mut s = SamplingParams::default();
        if i % 2 == 1 {
            s.temperature = 0.9;
            s.seed = Some(i);
        }
        s
    };
    // The unconstrained requests alone, then together with constrained ones in one batch.
    let mut e = engine(dir.path());
    for i in 0..4 {
        e.submit(request(i, prompt(i), 12, free(i))).unwrap();
    }
    let alone = drain(&mut e);
    let mut e = engine(dir.path());
    for i in 0..4 {
        e.submit(request(i, prompt(i), 12, free(i))).unwrap();
    }
    for (k, g) in grammars.iter().enumerate() {
        for j in 0..2u64 {
            let id = 10 + 2 * k as u64 + j;
            let sampling = SamplingParams {
                grammar: Some(compiler.compile(g, None).unwrap()),
                ..free(j)
            };
            e.submit(request(id, prompt(id), 64, sampling)).unwrap();
        }
    }
    let mixed = drain(&mut e);
    for i in 0..4 {
        assert_eq!(mixed[&RequestId(i)], alone[&RequestId(i)], "request {i}");
    }
    for k in 0..grammars.len() {
        for j in 0..2u64 {
            let id = RequestId(10 + 2 * k as u64 + j);
            let (tokens, reason) = &mixed[&id];
            // The grammar ended it (with ignore_eos: the end-of-sequence token does not).
            assert_eq!(*reason, FinishReason::Stop, "{id:?}");
            let text = codec.decode(tokens);
            let ok = match k {
                0 => {
                    let b = text.as_bytes();
                    b.len() == 6
                        && b[..3].iter().all(u8::is_ascii_digit)
                        && b[3] == b'-'
                        && b[4..].iter().all(u8::is_ascii_lowercase)
                }
                1 => text == "alpha" || text == "beta gamma",
                _ => serde_json::from_str::<serde_json::Value>(&text).is_ok_and(|v| {
                    v["n"].as_u64().is_some_and(|n| n <= 99) && v["ok"].is_boolean()
                }),
            };
            assert!(ok, "grammar {k}: {text:?}");
        }
    }
}
