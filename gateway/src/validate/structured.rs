//! Structured outputs: OpenAI's `response_format` and vLLM's `structured_outputs` and older
//! `guided_*` fields become one [`GrammarSpec`] (plain data), compiled once against the
//! model's tokenizer; a spec that does not compile is a 400 naming its field. The engine
//! applies the compiled grammar's token masks in sampling.

use serde_json::{Map, Value};
use superinfer_engine::grammar::{CompileError, Grammar, GrammarSpec};

use crate::error::{GatewayError, Result};
use crate::text::Text;
use crate::wire::Body;

/// The answer's constraint as the request states it: which field, and what.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Constraint {
    pub field: String,
    pub spec: GrammarSpec,
}

/// Backends vLLM users name in `guided_decoding_backend` that mean this one.
const BACKENDS: &[&str] = &["auto", "guidance", "llguidance"];

/// The request's constraint, if any, and the whitespace pattern of its JSON (vLLM's
/// `guided_whitespace_pattern` or `structured_outputs.whitespace_pattern`).
pub(super) fn constraint(body: &mut Body) -> Result<(Option<Constraint>, Option<String>)> {
    let mut found: Vec<Constraint> = Vec::new();
    let mut whitespace = body.guided_whitespace_pattern.take();
    if let Some(v) = body.response_format.take() {
        found.extend(response_format(v)?);
    }
    if let Some(v) = body.structured_outputs.take() {
        let (c, ws) = structured_outputs(v)?;
        found.extend(c);
        if ws.is_some() {
            whitespace = ws;
        }
    }
    if let Some(v) = body.guided_json.take() {
        found.push(Constraint {
            field: "guided_json".into(),
            spec: GrammarSpec::JsonSchema(schema_value("guided_json", v)?),
        });
    }
    if let Some(rx) = body.guided_regex.take() {
        found.push(Constraint {
            field: "guided_regex".into(),
            spec: GrammarSpec::Regex(rx),
        });
    }
    if let Some(choices) = body.guided_choice.take() {
        found.push(Constraint {
            field: "guided_choice".into(),
            spec: GrammarSpec::Choice(choices),
        });
    }
    if let Some(g) = body.guided_grammar.take() {
        found.push(Constraint {
            field: "guided_grammar".into(),
            spec: GrammarSpec::Lark(g),
        });
    }
    if let Some(b) = body.guided_decoding_backend.take() {
        if !BACKENDS.contains(&b.as_str()) {
            return Err(GatewayError::invalid(
                "guided_decoding_backend",
                format!(
                    "`guided_decoding_backend` {b:?} is not available: structured outputs run \
                     on llguidance; send \"guidance\" or leave it out"
                ),
            ));
        }
    }
    at_most_one(&found)?;
    let c = found.pop();
    let json = matches!(
        c.as_ref().map(|c| &c.spec),
        Some(GrammarSpec::JsonSchema(_) | GrammarSpec::JsonObject)
    );
    if whitespace.is_some() && !json {
        return Err(GatewayError::invalid(
            "guided_whitespace_pattern",
            "a whitespace pattern applies only to a JSON schema or JSON object constraint",
        ));
    }
    Ok((c, whitespace))
}

/// Compiles the constraint against the served model's tokenizer, once it is within the
/// grammar limits (`limits`), on the compiler's own threads and time budget.
pub(crate) fn compile(
    c: &Constraint,
    whitespace: Option<&str>,
    text: &Text,
    tenant: u32,
) -> Result<Grammar> {
    let field = top_field(&c.field);
    let field = field.as_str();
    super::limits::check(field, &c.spec)?;
    let compiler = text
        .grammar_compiler()
        .map_err(|e| GatewayError::invalid(field, e))?;
    compiler
        .compile_for(tenant, &c.spec, whitespace)
        .map_err(|e| match e {
            CompileError::Invalid(e) => GatewayError::invalid(
                field,
                format!("`{}` cannot be compiled to a grammar: {e}", c.field),
            ),
            CompileError::Budget(d) => GatewayError::invalid(
                field,
                format!(
                    "`{}` did not compile within the limit of {} ms (grammar compile budget); \
                 send a smaller grammar",
                    c.field,
                    d.as_millis()
                ),
            ),
            CompileError::Busy => GatewayError::Overloaded {
                message: "every grammar compiler is busy; retry after the Retry-After seconds"
                    .into(),
                retry_after_s: 1,
            },
        })
}

/// OpenAI's `response_format`: `text` (no constraint), `json_object`, or `json_schema` with
/// `{name, description, schema, strict}`.
fn response_format(v: Value) -> Result<Option<Constraint>> {
    let field = "response_format";
    let bad = |msg: String| GatewayError::invalid(field, msg);
    let Value::Object(mut map) = v else {
        return Err(bad(
            "`response_format` is an object such as {\"type\": \"json_object\"}".into(),
        ));
    };
    let kind = match map.remove("type") {
        Some(Value::String(s)) => s,
        _ => {
            return Err(bad(
                "`response_format.type` must be \"text\", \"json_object\" or \"json_schema\""
                    .into(),
            ))
        }
    };
    let allowed: &[&str] = match kind.as_str() {
        "json_schema" => &["json_schema"],
        _ => &[],
    };
    refuse_other_keys(field, &map, allowed)?;
    let spec = match kind.as_str() {
        "text" => return Ok(None),
        "json_object" => GrammarSpec::JsonObject,
        "json_schema" => {
            let Some(Value::Object(mut js)) = map.remove("json_schema") else {
                return Err(bad(
                    "`response_format.json_schema` must be an object with `name` and `schema`"
                        .into(),
                ));
            };
            let sub = "response_format.json_schema";
            refuse_other_keys(sub, &js, &["name", "description", "schema", "strict"])?;
            for key in ["name", "description"] {
                if js.get(key).is_some_and(|v| !v.is_string() && !v.is_null()) {
                    return Err(bad(format!("`{sub}.{key}` must be a string")));
                }
            }
            if js
                .get("strict")
                .is_some_and(|v| !v.is_boolean() && !v.is_null())
            {
                return Err(bad(format!("`{sub}.strict` must be true or false")));
            }
            match js.remove("schema") {
                Some(s) if !s.is_null() => GrammarSpec::JsonSchema(schema_value(field, s)?),
                _ => return Err(bad(format!("`{sub}.schema` is required"))),
            }
        }
        other => {
            return Err(bad(format!(
                "`response_format.type` {other:?} is not supported; send \"text\", \
                 \"json_object\" or \"json_schema\""
            )))
        }
    };
    Ok(Some(Constraint {
        field: field.into(),
        spec,
    }))
}

/// vLLM's `structured_outputs`: one of `json`, `regex`, `choice`, `grammar`, `json_object`,
/// with an optional `whitespace_pattern`.
fn structured_outputs(v: Value) -> Result<(Option<Constraint>, Option<String>)> {
    let field = "structured_outputs";
    let Value::Object(map) = v else {
        return Err(GatewayError::invalid(
            field,
            "`structured_outputs` is an object such as {\"regex\": \"[0-9]+\"}",
        ));
    };
    let keys = [
        "json",
        "regex",
        "choice",
        "grammar",
        "json_object",
        "whitespace_pattern",
    ];
    refuse_other_keys(field, &map, &keys)?;
    let mut found = Vec::new();
    let mut whitespace = None;
    for (k, v) in map {
        if v.is_null() {
            continue;
        }
        let name = format!("{field}.{k}");
        let wrong = |what: &str| GatewayError::invalid(field, format!("`{name}` {what}"));
        let string = |v: Value| match v {
            Value::String(s) => Ok(s),
            _ => Err(wrong("must be a string")),
        };
        let spec = match k.as_str() {
            "json" => GrammarSpec::JsonSchema(schema_value(&name, v)?),
            "regex" => GrammarSpec::Regex(string(v)?),
            "grammar" => GrammarSpec::Lark(string(v)?),
            "choice" => match serde_json::from_value::<Vec<String>>(v) {
                Ok(c) => GrammarSpec::Choice(c),
                Err(_) => return Err(wrong("must be a list of strings")),
            },
            "json_object" => match v {
                Value::Bool(true) => GrammarSpec::JsonObject,
                Value::Bool(false) => continue,
                _ => return Err(wrong("must be true or false")),
            },
            _ => {
                whitespace = Some(string(v)?);
                continue;
            }
        };
        found.push(Constraint { field: name, spec });
    }
    at_most_one(&found)?;
    Ok((found.pop(), whitespace))
}

/// The body field a path such as `structured_outputs.regex` is in (an error's `param`).
fn top_field(path: &str) -> String {
    path.split('.').next().unwrap_or(path).to_string()
}

/// A JSON schema sent as an object (or boolean), or as a string holding one.
fn schema_value(field: &str, v: Value) -> Result<Value> {
    match v {
        Value::Object(_) | Value::Bool(_) => Ok(v),
        Value::String(s) => match serde_json::from_str::<Value>(&s) {
            Ok(v @ (Value::Object(_) | Value::Bool(_))) => Ok(v),
            _ => Err(GatewayError::invalid(
                top_field(field),
                format!("`{field}` is a string that does not hold a JSON schema object"),
            )),
        },
        _ => Err(GatewayError::invalid(
            top_field(field),
            format!("`{field}` must be a JSON schema (an object)"),
        )),
    }
}

fn refuse_other_keys(field: &str, map: &Map<String, Value>, allowed: &[&str]) -> Result<()> {
    match map.keys().find(|k| !allowed.contains(&k.as_str())) {
        Some(k) => Err(GatewayError::invalid(
            top_field(field),
            format!("`{field}.{k}` is not supported here; leave it out"),
        )),
        None => Ok(()),
    }
}

/// A request constrains its answer one way: the second of two constraints is refused.
fn at_most_one(found: &[Constraint]) -> Result<()> {
    match found {
        [a, b, ..] => Err(GatewayError::invalid(
            top_field(&b.field),
            format!(
                "`{}` and `{}` both constrain the answer; send one of them",
                a.field, b.field
            ),
        )),
        _ => Ok(()),
    }
}
