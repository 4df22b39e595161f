//! Structured outputs: a [`GrammarSpec`] (plain data from the gateway: a JSON schema, a
//! regular expression, a list of choices or a Lark grammar) is compiled once by llguidance
//! against the model's tokenizer into a [`Grammar`]; each request that carries one gets its
//! own matcher in the engine, which computes the step's token mask on a CPU worker while the
//! model runs ([`mask`]), and the runner applies it to the logits before sampling.
//!
//! What this module does not do: read OpenAI's wire fields (the gateway's), or parse tool
//! calls out of text (the gateway's too).

pub mod mask;
pub mod pool;
#[cfg(all(test, feature = "model"))]
mod tests;

pub use mask::{MaskBoard, MaskRef, TokenMask};
pub use pool::{CompileError, CompilePool};

use crate::error::EngineError;
use crate::text::TextCodec;
use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

/// Compile threads of a [`GrammarCompiler`] made by [`GrammarCompiler::new`].
pub const COMPILE_WORKERS: usize = 2;
/// Compilations waiting for a thread, at most.
pub const COMPILE_QUEUE: usize = 16;
/// How long one compilation may take (a JSON schema of a few hundred properties takes tens
/// of milliseconds).
pub const COMPILE_BUDGET: Duration = Duration::from_secs(1);

/// What an answer must match.
#[derive(Clone, Debug, PartialEq)]
pub enum GrammarSpec {
    /// A JSON value valid against this JSON schema.
    JsonSchema(Value),
    /// Any JSON object (OpenAI's `json_object`).
    JsonObject,
    /// Text matching this regular expression (Rust `regex` syntax), whole.
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// A grammar in llguidance's Lark syntax.
    Lark(String),
}

/// JSON layout when the schema does not set its own (`x-guidance`): one space after `:` and
/// `,`, no other whitespace, so a small model cannot wander off into blank lines.
fn json_layout(whitespace_pattern: Option<&str>) -> Value {
    match whitespace_pattern {
        Some(p) => json!({"whitespace_pattern": p}),
        None => json!({
            "whitespace_flexible": false,
            "item_separator": ", ",
            "key_separator": ": ",
        }),
    }
}

impl GrammarSpec {
    /// The spec as llguidance's grammar; `whitespace_pattern` (vLLM's
    /// `guided_whitespace_pattern`) replaces the default JSON layout.
    fn to_llguidance(&self, whitespace_pattern: Option<&str>) -> Result<TopLevelGrammar, String> {
        Ok(match self {
            GrammarSpec::JsonSchema(schema) => {
                let mut schema = schema.clone();
                match &mut schema {
                    Value::Object(map) => {
                        map.entry("x-guidance")
                            .or_insert_with(|| json_layout(whitespace_pattern));
                    }
                    Value::Bool(_) => {}
                    _ => return Err("a JSON schema is an object or a boolean".into()),
                }
                TopLevelGrammar::from_json_schema(schema)
            }
            GrammarSpec::JsonObject => {
                let mut schema = json!({"type": "object"});
                schema["x-guidance"] = json_layout(whitespace_pattern);
                TopLevelGrammar::from_json_schema(schema)
            }
            GrammarSpec::Regex(rx) => TopLevelGrammar::from_regex(rx),
            GrammarSpec::Choice(choices) => {
                if choices.is_empty() {
                    return Err("the list of choices is empty".into());
                }
                // Lark string literals take JSON's escapes.
                let alts: Vec<String> = choices
                    .iter()
                    .map(|c| serde_json::to_string(c).expect("a string serializes"))
                    .collect();
                TopLevelGrammar::from_lark(format!("start: {}", alts.join(" | ")))
            }
            GrammarSpec::Lark(text) => {
                if text.trim().is_empty() {
                    return Err("the grammar is empty".into());
                }
                TopLevelGrammar::from_lark(text.clone())
            }
        })
    }
}

/// Compiles grammars against one model's tokenizer. Building it walks the vocabulary once
/// (a fraction of a second); keep one per served model. Cheap to clone.
#[derive(Clone)]
pub struct GrammarCompiler {
    factory: Arc<ParserFactory>,
    pool: Arc<CompilePool>,
}

impl std::fmt::Debug for GrammarCompiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarCompiler").finish_non_exhaustive()
    }
}

impl GrammarCompiler {
    /// A compiler for the model whose tokenizer is `codec`'s; `vocab_size` is the model's
    /// (its logits rows; at least the tokenizer's). The end-of-sequence ids are the codec's:
    /// a finished grammar allows only them.
    pub fn new(codec: &TextCodec, vocab_size: Option<usize>) -> Result<Self, EngineError> {
        let err = |e: String| EngineError::Text(format!("structured outputs: {e}"));
        let mut bt = codec.byte_tokenizer().map_err(err)?;
        let n = bt.tokrx_info().vocab_size;
        let eos: Vec<u32> = codec
            .eos_token_ids()
            .iter()
            .copied()
            .filter(|&t| t < n)
            .collect();
        if eos.is_empty() {
            return Err(err("the tokenizer has no end-of-sequence token".into()));
        }
        bt.set_eos_tokens(&eos);
        let vocab = vocab_size.map(|v| v.max(n as usize));
        let env = bt
            .into_tok_env(vocab)
            .map_err(|e| err(format!("token trie: {e}")))?;
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| err(format!("parser factory: {e}")))?;
        factory.quiet();
        // Errors reach clients: they say what is wrong, not the parser's state.
        factory.limits_mut().verbose_errors = false;
        let pool = CompilePool::new(COMPILE_WORKERS, COMPILE_QUEUE, COMPILE_BUDGET)
            .map_err(|e| err(format!("cannot start the compile threads: {e}")))?;
        Ok(GrammarCompiler {
            factory: Arc::new(factory),
            pool,
        })
    }

    /// The same compiler on another pool (its own threads, queue and budget).
    pub fn with_pool(self, pool: Arc<CompilePool>) -> Self {
        GrammarCompiler { pool, ..self }
    }

    /// Compiles `spec` on the compile pool; an invalid grammar's error says what is wrong
    /// with it (for a 400 naming the field).
    pub fn compile(
        &self,
        spec: &GrammarSpec,
        whitespace_pattern: Option<&str>,
    ) -> Result<Grammar, CompileError> {
        self.compile_for(u32::MAX, spec, whitespace_pattern)
    }

    /// [`GrammarCompiler::compile`] within `tenant`'s share of the compile threads
    /// ([`CompilePool::run_for`]).
    pub fn compile_for(
        &self,
        tenant: u32,
        spec: &GrammarSpec,
        whitespace_pattern: Option<&str>,
    ) -> Result<Grammar, CompileError> {
        let top = spec
            .to_llguidance(whitespace_pattern)
            .map_err(CompileError::Invalid)?;
        let factory = self.factory.clone();
        self.pool.run_for(tenant, move || {
            let parser = factory.create_parser(top).map_err(|e| e.to_string())?;
            let matcher = Matcher::new(Ok(parser));
            if let Some(e) = matcher.get_error() {
                return Err(e);
            }
            Ok(Grammar {
                proto: Arc::new(matcher),
            })
        })
    }
}

/// A compiled grammar: each request that uses it starts its own matcher from it. Compares
/// equal only to itself (or a clone).
#[derive(Clone)]
pub struct Grammar {
    proto: Arc<Matcher>,
}

impl Grammar {
    /// A fresh matcher at the start of the grammar, independent of every other.
    pub fn matcher(&self) -> Matcher {
        self.proto.deep_clone()
    }
}

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Grammar")
    }
}

impl PartialEq for Grammar {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.proto, &other.proto)
    }
}
