//! What a JSON schema holds that can blow up a grammar: its regular expressions (`pattern`,
//! `patternProperties`), how wide its `enum`s and `anyOf`/`oneOf`/`allOf`s are, and how long
//! its chains of local `$ref`s run through any JSON pointer (`#/$defs/a`, `#/properties/x`,
//! `#/anyOf/0/…`). Every walk is iterative: a schema is at most 64 levels deep by then, but
//! its values can be many.

use serde_json::{Map, Value};
use std::collections::HashMap;

/// The schema keywords whose arrays a grammar alternates over.
const WIDE: [&str; 4] = ["enum", "anyOf", "oneOf", "allOf"];

/// Calls `f` on every object inside `v` (`v` too), without recursion.
fn each_object<'a>(v: &'a Value, mut f: impl FnMut(&'a Map<String, Value>)) {
    let mut stack = vec![v];
    while let Some(v) = stack.pop() {
        match v {
            Value::Array(a) => stack.extend(a),
            Value::Object(o) => {
                f(o);
                stack.extend(o.values());
            }
            _ => {}
        }
    }
}

/// Every regular expression of `schema`: `pattern` strings and `patternProperties` keys.
pub(crate) fn patterns(schema: &Value) -> Vec<&str> {
    let mut out = Vec::new();
    each_object(schema, |o| {
        if let Some(Value::String(p)) = o.get("pattern") {
            out.push(p.as_str());
        }
        if let Some(Value::Object(p)) = o.get("patternProperties") {
            out.extend(p.keys().map(String::as_str));
        }
    });
    out
}

/// The widest `enum`, `anyOf`, `oneOf` or `allOf` of `schema`: its keyword and length.
pub(crate) fn widest(schema: &Value) -> Option<(&'static str, usize)> {
    let mut best: Option<(&'static str, usize)> = None;
    each_object(schema, |o| {
        for key in WIDE {
            if let Some(Value::Array(a)) = o.get(key) {
                if best.is_none_or(|(_, n)| a.len() > n) {
                    best = Some((key, a.len()));
                }
            }
        }
    });
    best
}

/// Every `$ref` string inside `v`.
fn refs_in(v: &Value) -> Vec<&str> {
    let mut out = Vec::new();
    each_object(v, |o| {
        if let Some(Value::String(r)) = o.get("$ref") {
            out.push(r.as_str());
        }
    });
    out
}

/// The value a local `$ref` (`#`, `#/a/b`, with JSON pointer escapes) points at.
fn resolve<'a>(schema: &'a Value, r: &str) -> Option<&'a Value> {
    let pointer = r.strip_prefix('#')?;
    if pointer.is_empty() {
        return Some(schema);
    }
    schema.pointer(&pointer.replace("%25", "%"))
}

/// How far `$ref`s reach in a schema.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum RefReach {
    /// The longest chain of refs through distinct targets (a cycle ends a chain).
    Chain(usize),
    /// More distinct local targets than `at_most`: not walked.
    TooMany(usize),
}

/// The longest chain of local `$ref`s from the schema's own refs (those outside its top-level
/// `$defs`/`definitions`) through the values they point at, through any JSON pointer; a ref
/// to nothing (or not local) ends a chain. Walks at most `at_most` distinct targets.
pub(crate) fn ref_reach(schema: &Value, at_most: usize) -> RefReach {
    let starts: Vec<&str> = match schema {
        Value::Object(map) => map
            .iter()
            .filter(|(k, _)| *k != "$defs" && *k != "definitions")
            .flat_map(|(k, v)| match (k.as_str(), v) {
                ("$ref", Value::String(r)) => vec![r.as_str()],
                _ => refs_in(v),
            })
            .collect(),
        _ => return RefReach::Chain(0),
    };
    // The refs each target makes, found once per distinct target.
    let mut kids: HashMap<&str, Vec<&str>> = HashMap::new();
    let mut todo = starts.clone();
    while let Some(r) = todo.pop() {
        if kids.contains_key(r) {
            continue;
        }
        if kids.len() == at_most {
            return RefReach::TooMany(at_most);
        }
        let made = resolve(schema, r).map(refs_in).unwrap_or_default();
        todo.extend(made.iter().copied());
        kids.insert(r, made);
    }
    RefReach::Chain(longest_chain(&starts, &kids))
}

/// The longest path from `starts` through `kids` visiting each node once on a path (a cycle
/// counts once), by an iterative depth-first search with memoized lengths.
fn longest_chain<'a>(starts: &[&'a str], kids: &HashMap<&'a str, Vec<&'a str>>) -> usize {
    // 1: on the path, 2: done.
    let mut mark: HashMap<&str, u8> = HashMap::new();
    let mut longest: HashMap<&str, usize> = HashMap::new();
    let mut best = 0;
    for &start in starts {
        let mut stack: Vec<(&str, usize)> = vec![(start, 0)];
        while let Some(&(node, next)) = stack.last() {
            let below = kids.get(node).map_or(&[][..], Vec::as_slice);
            if next == 0 {
                if mark.get(node) == Some(&2) {
                    stack.pop();
                    continue;
                }
                mark.insert(node, 1);
            }
            if let Some(&kid) = below.get(next) {
                stack.last_mut().expect("non-empty").1 += 1;
                if !mark.contains_key(kid) {
                    stack.push((kid, 0));
                }
                continue;
            }
            // All children done: this node's chain is one ref plus its longest child's.
            let deepest = below
                .iter()
                .filter(|k| mark.get(*k) == Some(&2))
                .filter_map(|k| longest.get(k))
                .max()
                .copied()
                .unwrap_or(0);
            longest.insert(node, 1 + deepest);
            mark.insert(node, 2);
            best = best.max(1 + deepest);
            stack.pop();
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn refs_are_followed_through_any_pointer_and_cycles_count_once() {
        let via_properties = json!({
            "type": "object",
            "properties": {
                "a": {"$ref": "#/properties/b"},
                "b": {"$ref": "#/properties/c"},
                "c": {"type": "object", "properties": {"x": {"$ref": "#/properties/d"}}},
                "d": {"type": "string"}
            }
        });
        // a → b → c → d.
        assert_eq!(ref_reach(&via_properties, 100), RefReach::Chain(3));
        let tree = json!({
            "$ref": "#/$defs/node",
            "$defs": {"node": {"type": "object", "properties": {
                "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}}
        });
        assert_eq!(ref_reach(&tree, 100), RefReach::Chain(1));
        let root = json!({"type": "object", "properties": {"self": {"$ref": "#"}}});
        assert_eq!(ref_reach(&root, 100), RefReach::Chain(1));
        assert_eq!(ref_reach(&via_properties, 2), RefReach::TooMany(2));
    }

    #[test]
    fn patterns_and_widths_are_found_anywhere() {
        let s = json!({
            "type": "object",
            "properties": {
                "pattern": {"type": "string", "pattern": "a{3}"},
                "tags": {"type": "array", "items": {"enum": [1, 2, 3, 4]}}
            },
            "patternProperties": {"^x-": {"type": "string", "pattern": "b+"}},
            "anyOf": [{"type": "object"}, {"type": "null"}]
        });
        let mut found = patterns(&s);
        found.sort_unstable();
        assert_eq!(found, ["^x-", "a{3}", "b+"]);
        assert_eq!(widest(&s), Some(("enum", 4)));
    }
}
