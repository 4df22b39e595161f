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
#[derive(Clone, Debug)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
    stopped: bool,
}

impl StopMatcher {
    /// Empty stop strings are ignored.
    pub fn new<S: AsRef<str>>(stops: &[S]) -> StopMatcher {
        StopMatcher {
            stops: stops
                .iter()
                .map(|s| s.as_ref().to_owned())
                .filter(|s| !s.is_empty())
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
        self.held.push_str(piece);
        let first = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min();
        if let Some(i) = first {
            self.stopped = true;
            let text = self.held[..i].to_owned();
            self.held.clear();
            return StopCheck {
                text,
                stopped: true,
            };
        }
        // Hold back the longest tail that is a proper prefix of a stop string.
        let keep = self
            .held
            .char_indices()
            .map(|(i, _)| i)
            .find(|&i| {
                let tail = &self.held[i..];
                self.stops.iter().any(|s| s.starts_with(tail))
            })
            .unwrap_or(self.held.len());
        let rest = self.held.split_off(keep);
        let text = std::mem::replace(&mut self.held, rest);
        StopCheck {
            text,
            stopped: false,
        }
    }

    /// The text held back, at the end of the stream (no stop string completed).
    pub fn finish(&mut self) -> String {
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
}
