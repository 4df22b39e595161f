use super::*;
use crate::model::tiny::write_tiny_model;
use llguidance::toktrie::SimpleVob;

fn codec() -> (tempfile::TempDir, TextCodec) {
    let dir = tempfile::tempdir().expect("temp dir");
    write_tiny_model(dir.path(), 3).expect("tiny model");
    let codec = TextCodec::from_model_dir(dir.path()).expect("codec");
    (dir, codec)
}

/// Feeds `text`'s tokens to a fresh matcher of `g`, checking each against the mask first;
/// returns the matcher after them.
fn feed(g: &Grammar, codec: &TextCodec, text: &str) -> Result<Matcher, String> {
    let mut m = g.matcher();
    for t in codec.encode(text, false).map_err(|e| e.to_string())? {
        let mask = TokenMask(m.compute_mask().map_err(|e| e.to_string())?);
        if !mask.is_allowed(t) {
            return Err(format!("token {t} of {text:?} is masked"));
        }
        m.consume_token(t).map_err(|e| e.to_string())?;
    }
    Ok(m)
}

/// After a complete answer, only end-of-sequence tokens are allowed (or the grammar stopped).
fn only_eos_left(m: &mut Matcher, codec: &TextCodec) -> bool {
    if m.is_stopped() {
        return true;
    }
    let mask = m.compute_mask().expect("mask");
    let eos = codec.eos_token_ids();
    mask.num_set() == eos.iter().filter(|&&t| mask.is_allowed(t)).count() && mask.num_set() > 0
}

#[test]
fn choices_admit_exactly_their_strings() {
    let (_d, codec) = codec();
    let c = GrammarCompiler::new(&codec, None).expect("compiler");
    let g = c
        .compile(
            &GrammarSpec::Choice(vec!["yes".into(), "no way".into()]),
            None,
        )
        .expect("compiles");
    let mut m = feed(&g, &codec, "no way").expect("a choice is allowed");
    assert!(only_eos_left(&mut m, &codec));
    assert!(feed(&g, &codec, "maybe").is_err());
}

#[test]
fn regex_and_json_schema_masks() {
    let (_d, codec) = codec();
    let c = GrammarCompiler::new(&codec, None).expect("compiler");
    let g = c
        .compile(&GrammarSpec::Regex("[0-9]{3}-[a-z]+".into()), None)
        .expect("compiles");
    assert!(feed(&g, &codec, "123-abc").is_ok());
    assert!(feed(&g, &codec, "12a").is_err());
    let schema = json!({
        "type": "object",
        "properties": {"age": {"type": "integer"}, "name": {"type": "string", "maxLength": 5}},
        "required": ["age", "name"],
        "additionalProperties": false
    });
    let g = c
        .compile(&GrammarSpec::JsonSchema(schema), None)
        .expect("compiles");
    let mut m = feed(&g, &codec, r#"{"age": 41, "name": "Ada"}"#).expect("valid JSON");
    assert!(only_eos_left(&mut m, &codec));
    assert!(feed(&g, &codec, r#"{"name": "Ada"}"#).is_err(), "age first");
    assert!(feed(&g, &codec, r#"{"age": "x"}"#).is_err());
    let obj = c.compile(&GrammarSpec::JsonObject, None).expect("compiles");
    assert!(feed(&obj, &codec, r#"{"k": [1, true, null]}"#).is_ok());
    assert!(feed(&obj, &codec, "[1]").is_err());
}

#[test]
fn lark_grammars_and_invalid_specs() {
    let (_d, codec) = codec();
    let c = GrammarCompiler::new(&codec, None).expect("compiler");
    let g = c
        .compile(
            &GrammarSpec::Lark("start: \"a\" num\nnum: /[0-9]+/".into()),
            None,
        )
        .expect("compiles");
    assert!(feed(&g, &codec, "a42").is_ok());
    assert!(feed(&g, &codec, "b").is_err());
    for bad in [
        GrammarSpec::Regex("(unclosed".into()),
        GrammarSpec::JsonSchema(json!({"type": "no-such-type"})),
        GrammarSpec::JsonSchema(json!([1])),
        GrammarSpec::Lark("start: undefined_rule".into()),
        GrammarSpec::Lark("  ".into()),
        GrammarSpec::Choice(vec![]),
    ] {
        assert!(c.compile(&bad, None).is_err(), "{bad:?} compiled");
    }
}

#[test]
fn masks_are_computed_on_the_worker_and_applied() {
    let (_d, codec) = codec();
    let c = GrammarCompiler::new(&codec, None).expect("compiler");
    let g = c
        .compile(&GrammarSpec::Regex("[0-9]+".into()), None)
        .expect("compiles");
    let mut m = g.matcher();
    let (board, tx) = MaskBoard::new();
    std::thread::scope(|s| {
        s.spawn(|| MaskBoard::compute(vec![None, Some(&mut m)], tx));
        assert!(MaskRef {
            board: &board,
            row: 0
        }
        .wait()
        .is_err());
        let mask = MaskRef {
            board: &board,
            row: 1,
        }
        .wait()
        .expect("mask");
        let digit = codec.encode("7", false).expect("ids")[0];
        let letter = codec.encode("x", false).expect("ids")[0];
        let mut row = vec![1.0f32; codec.vocab_size() + 3];
        mask.apply(&mut row);
        assert_eq!(row[digit as usize], 1.0);
        assert_eq!(row[letter as usize], f32::NEG_INFINITY);
        assert_eq!(row[codec.vocab_size() + 2], f32::NEG_INFINITY);
        assert!(mask.allowed() >= 10 && mask.allowed() < codec.vocab_size());
    });
}

#[test]
fn a_panicking_mask_fails_its_own_row_only() {
    let (board, tx) = MaskBoard::new();
    let rows = vec![Some(1u32), None, Some(2), Some(3)];
    MaskBoard::compute_with(rows, tx, |k| {
        if k == 2 {
            panic!("a bug in the grammar engine");
        }
        Ok(TokenMask(SimpleVob::alloc(8)))
    });
    let failures = board.failures([(0, 0), (2, 2), (3, 3)]);
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert_eq!(failures[0].0, 2);
    assert!(
        failures[0].1.contains("grammar engine failed"),
        "{failures:?}"
    );
}

#[test]
fn whitespace_pattern_replaces_the_compact_layout() {
    let (_d, codec) = codec();
    let c = GrammarCompiler::new(&codec, None).expect("compiler");
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
    let compact = c
        .compile(&GrammarSpec::JsonSchema(schema.clone()), None)
        .expect("compiles");
    assert!(feed(&compact, &codec, "{\"a\": 1}").is_ok());
    assert!(feed(&compact, &codec, "{\n\"a\": 1}").is_err());
    let loose = c
        .compile(&GrammarSpec::JsonSchema(schema), Some(r"[\n ]*"))
        .expect("compiles");
    assert!(feed(&loose, &codec, "{\n\"a\":1}").is_ok());
}

/// A Lark grammar that is a chain of `n` rules, each one reference deeper.
fn rule_chain(n: usize) -> String {
    let mut g = String::from("start: r0\n");
    for i in 0..n {
        g.push_str(&format!("r{i}: \"a\" r{}\n", i + 1));
    }
    g.push_str(&format!("r{n}: \"b\"\n"));
    g
}

/// A JSON schema whose `$ref`s chain through `n` definitions.
fn ref_chain(n: usize) -> Value {
    let mut defs = serde_json::Map::new();
    for i in 0..n {
        let next = format!("#/$defs/d{}", i + 1);
        defs.insert(
            format!("d{i}"),
            json!({"type": "object", "properties": {"x": {"$ref": next}}, "required": ["x"]}),
        );
    }
    defs.insert(format!("d{n}"), json!({"type": "integer"}));
    json!({"$ref": "#/$defs/d0", "$defs": defs})
}

/// Grammars as deep as the gateway's limits allow (1,024 rules, 64 `$ref`s) compile on the
/// compile threads, where they overflowed an ordinary thread's stack and aborted the process.
#[test]
fn grammars_at_the_depth_limits_compile_on_the_compile_threads() {
    let (_d, codec) = codec();
    let c = GrammarCompiler::new(&codec, None).expect("compiler");
    let pool = CompilePool::new(1, 4, Duration::from_secs(60)).expect("pool");
    let c = c.with_pool(pool);
    let g = c
        .compile(&GrammarSpec::Lark(rule_chain(1022)), None)
        .expect("a 1,024-rule chain compiles");
    assert!(feed(&g, &codec, &format!("{}b", "a".repeat(1022))).is_ok());
    c.compile(&GrammarSpec::JsonSchema(ref_chain(64)), None)
        .expect("a 64-deep $ref chain compiles");
}

/// An invalid grammar's error names the problem, not the parser's internal state.
#[test]
fn compile_errors_are_short() {
    let (_d, codec) = codec();
    let c = GrammarCompiler::new(&codec, None).expect("compiler");
    let e = c
        .compile(&GrammarSpec::Lark("start: undefined_rule\n".into()), None)
        .expect_err("an undefined rule");
    let CompileError::Invalid(text) = e else {
        panic!("not Invalid: {e:?}")
    };
    assert!(text.contains("undefined_rule"), "{text}");
    assert!(text.lines().count() <= 3, "{text}");
}

/// The first token masks of regexes whose repetitions multiply out (the gateway's regex-unit
/// limit is chosen from these): `cargo test --release -p superinfer-engine --lib
/// regex_mask_costs -- --ignored --nocapture`. Prints compile and 21-mask times.
#[test]
#[ignore = "a measurement, not a check"]
fn regex_mask_costs() {
    let (_d, codec) = codec();
    let c = GrammarCompiler::new(&codec, None).expect("compiler");
    let c = c.with_pool(CompilePool::new(1, 4, Duration::from_secs(120)).expect("pool"));
    let a = codec.encode("a", false).expect("encodes")[0];
    for rx in [
        "a{1000}{1000}",
        "(a{100}){1000}",
        "a{10000}",
        "(a{100}){100}",
        "(a{1,1000}){1000}",
        "a{1,100000}",
        ".{0,100000}",
    ] {
        let t = std::time::Instant::now();
        let g = c
            .compile(&GrammarSpec::Regex(rx.into()), None)
            .expect("compiles");
        let compile = t.elapsed();
        let t = std::time::Instant::now();
        let mut m = g.matcher();
        for _ in 0..20 {
            m.compute_mask().expect("a mask");
            if m.consume_token(a).is_err() {
                break;
            }
        }
        m.compute_mask().expect("a mask");
        eprintln!("{rx:20} compile {compile:?} masks {:?}", t.elapsed());
    }
}
