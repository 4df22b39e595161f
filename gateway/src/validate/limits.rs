//! Limits on a request's grammar (structured outputs and tool schemas), checked before it is
//! compiled: a grammar's size, its rule count, how deep it nests and how long its chains of
//! `$ref`s run. Each refusal is a 400 that names the field and the limit. The compiler runs
//! on threads with a stack sized for these limits and a time budget
//! (`superinfer_engine::grammar::pool`); the limits keep every grammar well inside both.

mod lark;
mod regex_cost;
mod schema;

use serde_json::Value;
use superinfer_engine::grammar::GrammarSpec;

use crate::error::{GatewayError, Result};

/// Bytes of a grammar's source: a Lark grammar, a regular expression, the choices together,
/// or a JSON schema as JSON.
pub const MAX_GRAMMAR_BYTES: usize = 128 * 1024;
/// Rules (and terminals) of a Lark grammar.
pub const MAX_GRAMMAR_RULES: usize = 1024;
/// Choices of `guided_choice` / `structured_outputs.choice`.
pub const MAX_CHOICES: usize = 1024;
/// Nesting of a JSON schema (objects and arrays inside each other), and of parentheses in a
/// Lark grammar or a regular expression.
pub const MAX_GRAMMAR_NESTING: usize = 64;
/// The longest chain of `$ref`s a JSON schema follows, through any local JSON pointer
/// (`a` → `b` → `c` is 2); a recursive schema's cycle counts once.
pub const MAX_REF_CHAIN: usize = 64;
/// Distinct local `$ref` targets of one JSON schema.
pub const MAX_REF_TARGETS: usize = 512;
/// A regular expression's characters and classes with its repetitions multiplied out by
/// their minimum counts (`a{100}{100}` is 10,000): what its lexer unrolls
/// ([`regex_cost`]). Applies to `guided_regex`, a schema's `pattern`s and a Lark grammar's
/// regex literals (times the grammar's largest repetition count).
pub const MAX_REGEX_UNITS: u64 = 10_000;
/// Branches of one alternation in a regular expression, and items of one `enum`, `anyOf`,
/// `oneOf` or `allOf` of a JSON schema.
pub const MAX_ALTERNATION: usize = 1024;

/// Checks `spec` (from request field `field`) against every limit above.
pub(crate) fn check(field: &str, spec: &GrammarSpec) -> Result<()> {
    let refuse = |what: String| {
        Err(GatewayError::invalid(
            field,
            format!("`{field}`: {what}; send a smaller grammar (limits in docs/API.md)"),
        ))
    };
    let bytes = match spec {
        GrammarSpec::JsonSchema(v) => serde_json::to_string(v).map_or(usize::MAX, |s| s.len()),
        GrammarSpec::JsonObject => 0,
        GrammarSpec::Regex(r) => r.len(),
        GrammarSpec::Choice(c) => c.iter().map(String::len).sum(),
        GrammarSpec::Lark(g) => g.len(),
    };
    if bytes > MAX_GRAMMAR_BYTES {
        return refuse(format!(
            "the grammar has {bytes} bytes, more than the limit of {MAX_GRAMMAR_BYTES} \
             (max grammar bytes)"
        ));
    }
    match spec {
        GrammarSpec::Choice(c) if c.len() > MAX_CHOICES => refuse(format!(
            "{} choices, more than the limit of {MAX_CHOICES} (max choices)",
            c.len()
        )),
        GrammarSpec::Lark(g) => {
            let rules = lark_rules(g);
            if rules > MAX_GRAMMAR_RULES {
                return refuse(format!(
                    "the grammar has {rules} rules, more than the limit of \
                     {MAX_GRAMMAR_RULES} (max grammar rules)"
                ));
            }
            nesting(field, paren_depth(g, false))?;
            // A repeated terminal unrolls its regex as many times.
            let times = lark::largest_count(g);
            for rx in lark::regexes(g) {
                regex(field, &rx, times)?;
            }
            Ok(())
        }
        GrammarSpec::Regex(r) => {
            nesting(field, paren_depth(r, true))?;
            regex(field, r, 1)
        }
        GrammarSpec::JsonSchema(v) => json_schema(field, v),
        _ => Ok(()),
    }
}

/// A JSON schema's limits: nesting, `$ref`s through any pointer, widths and its regexes.
pub(crate) fn json_schema(field: &str, v: &Value) -> Result<()> {
    let refuse = |what: String| {
        Err(GatewayError::invalid(
            field,
            format!("`{field}`: {what}; send a smaller schema (limits in docs/API.md)"),
        ))
    };
    nesting(field, json_depth(v))?;
    match schema::ref_reach(v, MAX_REF_TARGETS) {
        schema::RefReach::TooMany(n) => {
            return refuse(format!(
                "its `$ref`s point at more than {n} places (max $ref targets)"
            ))
        }
        schema::RefReach::Chain(chain) if chain > MAX_REF_CHAIN => {
            return refuse(format!(
                "its `$ref`s chain through {chain} definitions, more than the limit of \
                 {MAX_REF_CHAIN} (max $ref chain)"
            ))
        }
        schema::RefReach::Chain(_) => {}
    }
    if let Some((key, n)) = schema::widest(v).filter(|&(_, n)| n > MAX_ALTERNATION) {
        return refuse(format!(
            "an `{key}` of {n} items, more than the limit of {MAX_ALTERNATION} (max alternation)"
        ));
    }
    for p in schema::patterns(v) {
        regex(field, p, 1)?;
    }
    Ok(())
}

/// A regular expression's limits, its cost multiplied by `times` (a Lark repetition of it).
fn regex(field: &str, rx: &str, times: u64) -> Result<()> {
    let refuse = |what: String| {
        Err(GatewayError::invalid(
            field,
            format!("`{field}`: the regular expression {rx:?} {what}"),
        ))
    };
    let nest = MAX_GRAMMAR_NESTING as u32 * 2;
    let cost = match regex_cost::measure(rx, nest) {
        Ok(c) => c,
        Err(e) => return refuse(format!("is not valid: {e}")),
    };
    let units = cost.units.saturating_mul(times.max(1));
    if units > MAX_REGEX_UNITS {
        return refuse(format!(
            "repeats to {units} characters by its minimum counts, more than the limit of \
             {MAX_REGEX_UNITS} (max regex units); use ranges such as {{0,N}} or smaller counts"
        ));
    }
    if cost.widest > MAX_ALTERNATION {
        return refuse(format!(
            "has an alternation of {} branches, more than the limit of {MAX_ALTERNATION} \
             (max alternation)",
            cost.widest
        ));
    }
    Ok(())
}

fn nesting(field: &str, depth: usize) -> Result<()> {
    if depth > MAX_GRAMMAR_NESTING {
        return Err(GatewayError::invalid(
            field,
            format!(
                "`{field}`: the grammar nests {depth} levels deep, more than the limit of \
                 {MAX_GRAMMAR_NESTING} (max grammar nesting); send a flatter grammar"
            ),
        ));
    }
    Ok(())
}

/// Lines of a Lark grammar that define a rule or a terminal (`name:`, `?name:`, `NAME.2:`).
fn lark_rules(g: &str) -> usize {
    g.lines()
        .filter(|line| {
            let l = line.trim_start().trim_start_matches(['?', '!']);
            let name_end = l
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'))
                .unwrap_or(l.len());
            name_end > 0
                && l[..name_end].starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
                && l[name_end..].trim_start().starts_with(':')
        })
        .count()
}

/// Where [`paren_depth`] is in a grammar's text.
#[derive(Clone, Copy)]
enum Scan {
    /// Lark's own syntax: `(…)`, `[…]` (optional) and `{…}` nest.
    Lark,
    /// A Lark string literal.
    Str,
    /// A regular expression: `(…)` nests; a character class `[…]` is literal. `closes`: a
    /// Lark regex literal, which ends at its unescaped `/`.
    Regex { class: bool, closes: bool },
}

/// The deepest nesting of a Lark grammar (`regex`: false) or a regular expression, outside
/// string literals, escapes and character classes.
fn paren_depth(s: &str, regex: bool) -> usize {
    let (mut depth, mut max) = (0usize, 0usize);
    let mut mode = if regex {
        Scan::Regex {
            class: false,
            closes: false,
        }
    } else {
        Scan::Lark
    };
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        let (open, close) = match (mode, c) {
            (_, '\\') => {
                chars.next();
                (false, false)
            }
            (Scan::Lark, '"') => {
                mode = Scan::Str;
                (false, false)
            }
            (Scan::Lark, '/') => {
                mode = Scan::Regex {
                    class: false,
                    closes: true,
                };
                (false, false)
            }
            (Scan::Lark, c) => (matches!(c, '(' | '[' | '{'), matches!(c, ')' | ']' | '}')),
            (Scan::Str, '"') => {
                mode = Scan::Lark;
                (false, false)
            }
            (Scan::Str, _) => (false, false),
            (
                Scan::Regex {
                    class: true,
                    closes,
                },
                ']',
            ) => {
                mode = Scan::Regex {
                    class: false,
                    closes,
                };
                (false, false)
            }
            (Scan::Regex { class: true, .. }, _) => (false, false),
            (Scan::Regex { closes, .. }, '[') => {
                mode = Scan::Regex {
                    class: true,
                    closes,
                };
                (false, false)
            }
            (Scan::Regex { closes: true, .. }, '/') => {
                mode = Scan::Lark;
                (false, false)
            }
            (Scan::Regex { .. }, c) => (c == '(', c == ')'),
        };
        if open {
            depth += 1;
            max = max.max(depth);
        } else if close {
            depth = depth.saturating_sub(1);
        }
    }
    max
}

/// The nesting depth of a JSON value, without recursion.
fn json_depth(v: &Value) -> usize {
    let mut max = 0;
    let mut stack = vec![(v, 1usize)];
    while let Some((v, d)) = stack.pop() {
        max = max.max(d);
        match v {
            Value::Array(a) => stack.extend(a.iter().map(|x| (x, d + 1))),
            Value::Object(o) => stack.extend(o.values().map(|x| (x, d + 1))),
            _ => {}
        }
    }
    max
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn param(r: Result<()>) -> String {
        match r {
            Err(GatewayError::InvalidRequest { param, message }) => {
                assert!(message.contains("limit"), "{message}");
                param.unwrap_or_default()
            }
            other => panic!("not a 400: {other:?}"),
        }
    }

    /// A schema whose `$ref`s chain through `n` definitions.
    fn ref_chain_schema(n: usize) -> Value {
        let mut defs = serde_json::Map::new();
        for i in 0..n {
            let body = if i + 1 < n {
                json!({"type": "object", "properties": {"x": {"$ref": format!("#/$defs/d{}", i + 1)}}})
            } else {
                json!({"type": "string"})
            };
            defs.insert(format!("d{i}"), body);
        }
        json!({"$ref": "#/$defs/d0", "$defs": defs})
    }

    #[test]
    fn ref_chains_are_measured_and_cycles_count_once() {
        use schema::{ref_reach, RefReach::Chain};
        assert_eq!(ref_reach(&ref_chain_schema(1), 100), Chain(1));
        assert_eq!(ref_reach(&ref_chain_schema(10), 100), Chain(10));
        let tree = json!({
            "$ref": "#/$defs/node",
            "$defs": {"node": {"type": "object", "properties": {
                "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}}
        });
        assert_eq!(ref_reach(&tree, 100), Chain(1));
        assert!(check("guided_json", &GrammarSpec::JsonSchema(tree)).is_ok());
        assert!(check(
            "f",
            &GrammarSpec::JsonSchema(ref_chain_schema(MAX_REF_CHAIN))
        )
        .is_ok());
        let long = GrammarSpec::JsonSchema(ref_chain_schema(250));
        assert_eq!(param(check("response_format", &long)), "response_format");
    }

    #[test]
    fn every_limit_refuses_by_name() {
        let chain: String = (0..1100)
            .map(|i| format!("r{i}: r{} \"a\"\n", i + 1))
            .collect();
        let lark = GrammarSpec::Lark(format!("start: r0\n{chain}r1100: \"b\"\n"));
        assert_eq!(param(check("guided_grammar", &lark)), "guided_grammar");
        let choices = GrammarSpec::Choice((0..66_000).map(|i| i.to_string()).collect());
        assert_eq!(param(check("guided_choice", &choices)), "guided_choice");
        let big = GrammarSpec::Regex("a".repeat(MAX_GRAMMAR_BYTES + 1));
        assert_eq!(param(check("guided_regex", &big)), "guided_regex");
        let deep_rx = GrammarSpec::Regex(format!("{}a{}", "(".repeat(65), ")".repeat(65)));
        assert_eq!(param(check("guided_regex", &deep_rx)), "guided_regex");
        let mut deep = json!({"type": "string"});
        for _ in 0..70 {
            deep = json!({"type": "array", "items": deep});
        }
        assert_eq!(
            param(check("guided_json", &GrammarSpec::JsonSchema(deep))),
            "guided_json"
        );
        let bombs = [
            GrammarSpec::Regex("a{1000}{1000}".into()),
            GrammarSpec::Regex("(a{101}){100}".into()),
            GrammarSpec::Lark("start: /a{1000}/{1000}".into()),
            GrammarSpec::Lark("start: x\nx: /a{20}[/]/{1000}".into()),
            GrammarSpec::JsonSchema(json!({"type": "string", "pattern": "a{1000}{1000}"})),
            GrammarSpec::JsonSchema(json!({"patternProperties": {"b{99}{999}": {}}})),
            GrammarSpec::JsonSchema(json!({"enum": (0..1025).collect::<Vec<_>>()})),
            GrammarSpec::JsonSchema(json!({"anyOf": vec![json!({"type": "null"}); 1025]})),
            GrammarSpec::Regex(
                (0..1025)
                    .map(|i| format!("w{i}"))
                    .collect::<Vec<_>>()
                    .join("|"),
            ),
        ];
        for b in bombs {
            assert_eq!(param(check("f", &b)), "f", "{b:?}");
        }
        // A chain of refs through `properties` pointers counts as one through `$defs` does.
        let mut props = serde_json::Map::new();
        for i in 0..100 {
            props.insert(
                format!("p{i}"),
                json!({"$ref": format!("#/properties/p{}", i + 1)}),
            );
        }
        props.insert("p100".into(), json!({"type": "string"}));
        let chain = GrammarSpec::JsonSchema(json!({"type": "object", "properties": props}));
        assert_eq!(param(check("tools", &chain)), "tools");
    }

    #[test]
    fn ordinary_grammars_pass() {
        let lark = "start: item+\n?item: NUMBER | WORD\nNUMBER: /[0-9]+/\nWORD.2: /[a-z]+/\n";
        assert_eq!(lark_rules(lark), 4);
        assert!(check("guided_grammar", &GrammarSpec::Lark(lark.into())).is_ok());
        // Brackets inside strings, classes and escapes are not nesting.
        assert_eq!(paren_depth(r#"start: "((((" /[(]\(/ (a [b])"#, false), 2);
        assert_eq!(paren_depth(r"[(((]\((a)", true), 1);
        assert!(check("guided_regex", &GrammarSpec::Regex(r"\d{3}-[a-z]+".into())).is_ok());
        let choices = GrammarSpec::Choice(vec!["yes".into(), "no".into()]);
        assert!(check("guided_choice", &choices).is_ok());
        for ok in [
            r"a{1,100000}",
            r".{0,100000}",
            r"(a{100}){100}",
            r"[0-9a-f]{8}-[0-9a-f]{4}",
        ] {
            assert!(
                check("guided_regex", &GrammarSpec::Regex(ok.into())).is_ok(),
                "{ok}"
            );
        }
        let tool = json!({"type": "object", "properties": {"city": {"$ref": "#/$defs/City"}},
                          "$defs": {"City": {"type": "object", "properties": {
                              "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}}}});
        assert!(check("tools", &GrammarSpec::JsonSchema(tool)).is_ok());
    }
}
