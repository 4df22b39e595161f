//! What the grammar limits read in a Lark grammar's text: its regex literals and its largest
//! repetition count, outside string literals and comments' reach as llguidance's lexer sees
//! them (a `/…/` literal ends at its unescaped `/` outside a character class).

/// The regex literals (`/…/`) of a Lark grammar, `\/` read as `/`.
pub(super) fn regexes(g: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut chars = g.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                // A string literal: skip to its unescaped closing quote.
                while let Some(c) = chars.next() {
                    match c {
                        '\\' => {
                            chars.next();
                        }
                        '"' => break,
                        _ => {}
                    }
                }
            }
            '/' => {
                let mut rx = String::new();
                let mut class = false;
                while let Some(c) = chars.next() {
                    match (c, class) {
                        ('\\', _) => match chars.next() {
                            Some('/') => rx.push('/'),
                            Some(e) => {
                                rx.push('\\');
                                rx.push(e);
                            }
                            None => {}
                        },
                        ('/', false) => break,
                        ('[', false) => {
                            class = true;
                            rx.push(c);
                        }
                        (']', true) => {
                            class = false;
                            rx.push(c);
                        }
                        _ => rx.push(c),
                    }
                }
                out.push(rx);
            }
            _ => {}
        }
    }
    out
}

/// The largest minimum count of a repetition in a Lark grammar's own syntax (`x{3}`,
/// `x{2,5}`, `x ~ 4`, `x ~ 4..8`), outside literals; 1 when there is none.
pub(super) fn largest_count(g: &str) -> u64 {
    let mut best = 1u64;
    let bytes = g.as_bytes();
    let mut i = 0;
    let (mut in_str, mut in_rx, mut class) = (false, false, false);
    while i < bytes.len() {
        match bytes[i] {
            b'\\' if in_str || in_rx => i += 1,
            b'"' if !in_rx => in_str = !in_str,
            b'[' if in_rx => class = true,
            b']' if in_rx => class = false,
            b'/' if !in_str && !class => in_rx = !in_rx,
            b'{' | b'~' if !in_str && !in_rx => {
                let rest = g[i + 1..].trim_start();
                let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
                if let Ok(n) = rest[..digits].parse::<u64>() {
                    best = best.max(n);
                }
            }
            _ => {}
        }
        i += 1;
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regex_literals_and_counts_are_read_outside_strings() {
        let g = r#"start: "/not/" x{3} /a{2}\/[/]b/ ~ 7
x: /c/i y ~ 2..9
y: "{1000}""#;
        assert_eq!(regexes(g), ["a{2}/[/]b", "c"]);
        assert_eq!(largest_count(g), 7);
        assert_eq!(largest_count("start: /a{1000}/{1000}"), 1000);
        assert_eq!(largest_count("start: /a{10}[/]/{1000}"), 1000);
        assert_eq!(largest_count("start: %json {\"type\": \"object\"}"), 1);
    }
}
