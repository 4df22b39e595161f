//! Stop strings over streamed text: the engine stops on token ids; a stop *string* can span
//! several tokens and partial characters, so it is matched on the detokenized stream.

/// What [`StopMatcher::push`] lets through.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StopCheck {
    /// Text safe to send: it cannot be part of a stop string.
    pub text: String,
    /// A stop string was found; `text` ends right before it (the stop string is not sent, as
    /// OpenAI's API does) and the request should be aborted.
    pub stopped: bool,
}

/// Matches stop strings in streamed text, holding back a tail that could still grow into one.
///
/// Each stop string runs a Knuth-Morris-Pratt automaton over the text's bytes, so a piece
/// costs O(its bytes × stop strings) however long the stream or the stop strings are, and the
/// tail held back is never longer than the longest stop string. A stop string is found when
/// its last byte arrives (the first to complete wins; of several completing at the same byte,
/// the longest).
#[derive(Clone, Debug)]
pub struct StopMatcher {
    stops: Vec<Pattern>,
    held: String,
    stopped: bool,
}

/// One stop string's automaton: `state` bytes of it match the end of the text so far.
#[derive(Clone, Debug)]
struct Pattern {
    bytes: Vec<u8>,
    /// `fail[k]`: the longest proper prefix of `bytes[..=k]` that is also its suffix.
    fail: Vec<usize>,
    state: usize,
}

impl Pattern {
    fn new(s: &str) -> Pattern {
        let bytes = s.as_bytes().to_vec();
        let mut fail = vec![0; bytes.len()];
        let mut k = 0;
        for i in 1..bytes.len() {
            while k > 0 && bytes[i] != bytes[k] {
                k = fail[k - 1];
            }
            if bytes[i] == bytes[k] {
                k += 1;
            }
            fail[i] = k;
        }
        Pattern {
            bytes,
            fail,
            state: 0,
        }
    }

    /// Feeds one byte; `true` when the whole stop string now ends the text.
    fn advance(&mut self, b: u8) -> bool {
        if self.state == self.bytes.len() {
            self.state = self.fail[self.state - 1];
        }
        while self.state > 0 && self.bytes[self.state] != b {
            self.state = self.fail[self.state - 1];
        }
        if self.bytes[self.state] == b {
            self.state += 1;
        }
        self.state == self.bytes.len()
    }
}

impl StopMatcher {
    /// Empty stop strings are ignored.
    pub fn new<S: AsRef<str>>(stops: &[S]) -> StopMatcher {
        StopMatcher {
            stops: stops
                .iter()
                .map(AsRef::as_ref)
                .filter(|s| !s.is_empty())
                .map(Pattern::new)
                .collect(),
            held: String::new(),
            stopped: false,
        }
    }

    /// Adds a piece of text (e.g. from [`crate::IncrementalDecoder::push`]).
    pub fn push(&mut self, piece: &str) -> StopCheck {
        if self.stopped {
            return StopCheck {
                text: String::new(),
                stopped: true,
            };
        }
        let base = self.held.len();
        self.held.push_str(piece);
        for (i, b) in piece.bytes().enumerate() {
            let mut found: Option<usize> = None;
            for p in &mut self.stops {
                if p.advance(b) {
                    found = found.max(Some(p.bytes.len()));
                }
            }
            if let Some(len) = found {
                // The matched bytes are all held: the tail kept is as long as every state.
                let start = base + i + 1 - len;
                self.stopped = true;
                let mut text = std::mem::take(&mut self.held);
                text.truncate(start);
                return StopCheck {
                    text,
                    stopped: true,
                };
            }
        }
        // Hold back the longest tail that is a proper prefix of a stop string. It begins with
        // a stop string's first byte, so on a character boundary.
        let keep = self.stops.iter().map(|p| p.state).max().unwrap_or(0);
        let rest = self.held.split_off(self.held.len() - keep);
        let text = std::mem::replace(&mut self.held, rest);
        StopCheck {
            text,
            stopped: false,
        }
    }

    /// The text held back, at the end of the stream (no stop string completed).
    pub fn finish(&mut self) -> String {
        for p in &mut self.stops {
            p.state = 0;
        }
        std::mem::take(&mut self.held)
    }

    /// Whether a stop string was found.
    pub fn stopped(&self) -> bool {
        self.stopped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stop_string_split_over_pieces_is_found_and_not_sent() {
        let mut m = StopMatcher::new(&["\n\nUser:", "END"]);
        let mut sent = String::new();
        let mut stopped = false;
        for piece in ["Hello", " world\n", "\nUs", "er: more"] {
            let c = m.push(piece);
            sent.push_str(&c.text);
            stopped |= c.stopped;
        }
        assert!(stopped);
        assert_eq!(sent, "Hello world");
        assert!(m.push("x").text.is_empty());
    }

    #[test]
    fn a_false_start_is_released_and_the_tail_flushed() {
        let mut m = StopMatcher::new(&["END"]);
        assert_eq!(m.push("the EN").text, "the ");
        assert_eq!(m.push("d é").text, "ENd é");
        assert_eq!(m.push("E").text, "");
        assert_eq!(m.finish(), "E");
        assert!(!m.stopped());
        let mut none = StopMatcher::new::<&str>(&[]);
        assert_eq!(none.push("abc").text, "abc");
    }

    #[test]
    fn the_earliest_stop_wins() {
        let mut m = StopMatcher::new(&["cd", "b"]);
        let c = m.push("abcd");
        assert_eq!(c.text, "a");
        assert!(c.stopped);
    }

    // Moved from the gateway, which now uses this matcher.
    fn check(text: impl Into<String>, stopped: bool) -> StopCheck {
        StopCheck {
            text: text.into(),
            stopped,
        }
    }

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut m = StopMatcher::new(stops);
        let mut out = String::new();
        for p in pieces {
            let c = m.push(p);
            out.push_str(&c.text);
            if c.stopped {
                return (out, true);
            }
        }
        out.push_str(&m.finish());
        (out, false)
    }

    #[test]
    fn no_stops_pass_everything_through_in_pieces() {
        assert_eq!(run(&[], &["a", "b"]), ("ab".into(), false));
    }

    #[test]
    fn a_stop_split_across_pieces_is_cut_and_never_shown() {
        let mut m = StopMatcher::new(&["END"]);
        assert_eq!(m.push("hello E"), check("hello ", false));
        assert_eq!(m.push("N"), check(String::new(), false));
        assert_eq!(m.push("D and more"), check(String::new(), true));
    }

    #[test]
    fn a_false_start_is_released_whole() {
        assert_eq!(run(&["END"], &["E", "N", "x"]), ("ENx".into(), false));
        assert_eq!(run(&["END"], &["xx E"]), ("xx E".into(), false));
    }

    #[test]
    fn the_earliest_of_several_stops_wins_and_multibyte_text_is_safe() {
        assert_eq!(
            run(&["world", "lo"], &["hello world"]),
            ("hel".into(), true)
        );
        assert_eq!(run(&["é!"], &["café", "é", "!"]), ("café".into(), true));
    }

    #[test]
    fn overlapping_prefixes_are_found_as_a_naive_search_finds_them() {
        // KMP's fall-backs: "aab" inside "aaab", "abab" after "ababab".
        assert_eq!(run(&["aab"], &["a", "a", "a", "b!"]), ("a".into(), true));
        assert_eq!(run(&["ababc"], &["abababc"]), ("ab".into(), true));
        assert_eq!(run(&["ababc"], &["ababab", "x"]), ("abababx".into(), false));
        // Of two stops completing at one byte, the longer (earlier) one cuts.
        assert_eq!(run(&["c", "abc"], &["xab", "c"]), ("x".into(), true));
    }

    #[test]
    fn the_tail_held_back_is_never_longer_than_the_longest_stop() {
        let mut m = StopMatcher::new(&["xyz"]);
        let mut sent = 0;
        for _ in 0..10_000 {
            sent += m.push("xy").text.len();
        }
        assert_eq!(m.finish().len(), 2);
        assert_eq!(sent, 2 * 10_000 - 2);
    }
}
