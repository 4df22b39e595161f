//! Stop strings: the answer ends just before the first occurrence of any of them, which is
//! not sent. While the end of the text could still become a stop string, that end is held
//! back, so a streamed answer never shows part of a stop string.

/// Cuts a stream of text pieces at the first stop string.
#[derive(Clone, Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
    stopped: bool,
}

impl StopMatcher {
    pub fn new(stops: Vec<String>) -> StopMatcher {
        StopMatcher {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            held: String::new(),
            stopped: false,
        }
    }

    /// Adds `text`; returns what may be sent now and whether a stop string was reached.
    pub fn push(&mut self, text: &str) -> (String, bool) {
        if self.stopped {
            return (String::new(), true);
        }
        if self.stops.is_empty() {
            return (text.to_string(), false);
        }
        self.held.push_str(text);
        let first = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min();
        if let Some(at) = first {
            self.stopped = true;
            let mut out = std::mem::take(&mut self.held);
            out.truncate(at);
            return (out, true);
        }
        let keep_from = self.partial_start();
        let rest = self.held.split_off(keep_from);
        (std::mem::replace(&mut self.held, rest), false)
    }

    /// The text still held back, at the end of the answer.
    pub fn finish(&mut self) -> String {
        if self.stopped {
            return String::new();
        }
        std::mem::take(&mut self.held)
    }

    /// Where the longest suffix of `held` that begins some stop string starts.
    fn partial_start(&self) -> usize {
        let longest = self.stops.iter().map(String::len).max().unwrap_or(0);
        let min_start = self.held.len().saturating_sub(longest.saturating_sub(1));
        (min_start..self.held.len())
            .filter(|&i| self.held.is_char_boundary(i))
            .find(|&i| {
                let tail = &self.held[i..];
                self.stops.iter().any(|s| s.starts_with(tail))
            })
            .unwrap_or(self.held.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for p in pieces {
            let (emit, stopped) = m.push(p);
            out.push_str(&emit);
            if stopped {
                return (out, true);
            }
        }
        out.push_str(&m.finish());
        (out, false)
    }

    #[test]
    fn no_stops_pass_everything_through() {
        assert_eq!(run(&[], &["a", "b"]), ("ab".into(), false));
    }

    #[test]
    fn a_stop_split_across_pieces_is_cut_and_never_shown() {
        let mut m = StopMatcher::new(vec!["END".into()]);
        assert_eq!(m.push("hello E"), ("hello ".into(), false));
        assert_eq!(m.push("N"), (String::new(), false));
        assert_eq!(m.push("D and more"), (String::new(), true));
    }

    #[test]
    fn a_false_start_is_released() {
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
