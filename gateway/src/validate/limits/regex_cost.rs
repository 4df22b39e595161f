//! What a regular expression costs the structured-output lexer, measured before it compiles.
//!
//! llguidance builds its lexer lazily, by derivatives, while it computes token masks: a
//! counted repetition is unrolled as the lexer walks into it, so the work of a mask grows with
//! the repetitions multiplied out by their *minimum* counts (`a{1000}{1000}`: a million
//! units, about 0.9 s for the first mask of the tiny model, inside a model step), not with
//! their maximum (`a{1,100000}` and `.{0,100000}`: under 0.2 ms). That work is spent outside
//! llguidance's fuel limits, so it is bounded here (figures: `docs/API.md`, "Limits on one
//! request").

use regex_syntax::hir::{Hir, HirKind};

/// What [`measure`] found in a regular expression.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RegexCost {
    /// Characters and classes with every repetition multiplied out by its minimum count (a
    /// count of 0 counts as 1: the repeated part is still built).
    pub units: u64,
    /// The most branches of one alternation.
    pub widest: usize,
}

/// Parses `rx` as llguidance does (Rust `regex` syntax) and measures it; the parser's error
/// when it is not a regular expression. `nest_limit` bounds the parser's recursion.
pub(crate) fn measure(rx: &str, nest_limit: u32) -> Result<RegexCost, String> {
    let hir = regex_syntax::ParserBuilder::new()
        .nest_limit(nest_limit)
        .build()
        .parse(rx)
        .map_err(|e| e.to_string())?;
    Ok(cost(&hir))
}

/// The cost of `hir`, by recursion no deeper than the parser's nest limit.
fn cost(hir: &Hir) -> RegexCost {
    match hir.kind() {
        HirKind::Empty | HirKind::Look(_) => RegexCost::default(),
        HirKind::Literal(l) => RegexCost {
            units: l.0.len() as u64,
            widest: 0,
        },
        HirKind::Class(_) => RegexCost {
            units: 1,
            widest: 0,
        },
        HirKind::Repetition(r) => {
            let inner = cost(&r.sub);
            RegexCost {
                units: inner.units.saturating_mul(u64::from(r.min.max(1))),
                widest: inner.widest,
            }
        }
        HirKind::Capture(c) => cost(&c.sub),
        HirKind::Concat(parts) => sum(parts, 0),
        HirKind::Alternation(parts) => sum(parts, parts.len()),
    }
}

fn sum(parts: &[Hir], widest: usize) -> RegexCost {
    parts
        .iter()
        .map(cost)
        .fold(RegexCost { units: 0, widest }, |a, b| RegexCost {
            units: a.units.saturating_add(b.units),
            widest: a.widest.max(b.widest),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn units(rx: &str) -> u64 {
        measure(rx, 128).unwrap().units
    }

    #[test]
    fn repetitions_multiply_by_their_minimum_counts() {
        assert_eq!(units("a{1000}{1000}"), 1_000_000);
        assert_eq!(units("(a{100}){100}"), 10_000);
        assert_eq!(units("a{1,100000}"), 1);
        assert_eq!(units(".{0,100000}"), 1);
        assert_eq!(units(r"\d{3}-[a-z]+"), 5);
        assert_eq!(units("(ab|cd){3}"), 12);
        assert_eq!(measure("(foo|bar|baz)", 128).unwrap().widest, 3);
        assert!(measure("(unclosed", 128).is_err());
    }
}
