//! Multi-turn conversations and the prompt content that repeats across them.
//!
//! A conversation is a closed loop: its first turn arrives by the tenant's arrival process,
//! turn k+1 is sent only after turn k finished plus a think time, and its prompt is the whole
//! history (the tenant's system prompt, every earlier user message and every earlier answer as
//! the server returned it) followed by a new user message. The shapes and their sources are in
//! `docs/WORKLOADS.md`.
//!
//! Content is deterministic: the twin sends token ids and the HTTP target real words, both
//! drawn from seeds, so that a prompt repeats exactly wherever it should (the system prompt of
//! a tenant, a conversation's history) and nowhere else.

use crate::error::Error;
use rand::Rng;
use rand_distr::{Distribution, Exp, Geometric};
use serde::{Deserialize, Serialize};

/// How a tenant's conversations go on after their first turn.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConversationSpec {
    /// Mean turns per conversation (>= 1): 1 + a geometric number of follow-ups.
    pub turns_mean: f64,
    /// Mean think time between an answer and the next turn, seconds (exponential; 0: none).
    #[serde(default)]
    pub think_time_s: f64,
    /// Turns are capped here (the geometric tail is cut).
    #[serde(default = "default_max_turns")]
    pub max_turns: u32,
}

fn default_max_turns() -> u32 {
    64
}

impl ConversationSpec {
    pub fn new(turns_mean: f64, think_time_s: f64) -> ConversationSpec {
        ConversationSpec {
            turns_mean,
            think_time_s,
            max_turns: default_max_turns(),
        }
    }

    pub fn validate(&self) -> Result<(), Error> {
        let bad = |problem: String| Error::Lengths {
            kind: "conversation",
            problem,
        };
        if !(self.turns_mean.is_finite() && self.turns_mean >= 1.0) {
            return Err(bad(format!(
                "turns_mean must be >= 1, got {}",
                self.turns_mean
            )));
        }
        if !(self.think_time_s.is_finite() && self.think_time_s >= 0.0) {
            return Err(bad(format!(
                "think_time_s must be >= 0, got {}",
                self.think_time_s
            )));
        }
        if self.max_turns == 0 {
            return Err(bad("max_turns must be at least 1".into()));
        }
        Ok(())
    }

    /// Turns of one conversation: 1 + Geometric(p) follow-ups with `p = 1 / turns_mean`
    /// (mean `turns_mean`), at most `max_turns`.
    pub fn sample_turns<R: Rng + ?Sized>(&self, rng: &mut R) -> u32 {
        let p = 1.0 / self.turns_mean;
        let extra = if p >= 1.0 {
            0
        } else {
            Geometric::new(p)
                .expect("p is in (0, 1) after validation")
                .sample(rng)
        };
        (1 + extra).min(u64::from(self.max_turns)) as u32
    }

    /// One think time, seconds.
    pub fn sample_think_s<R: Rng + ?Sized>(&self, rng: &mut R) -> f64 {
        if self.think_time_s == 0.0 {
            return 0.0;
        }
        Exp::new(1.0 / self.think_time_s)
            .expect("a positive rate after validation")
            .sample(rng)
    }
}

/// A request's place in its conversation.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Turn {
    /// Unique within a run.
    pub conversation: u64,
    /// 0 for the first turn.
    pub index: u32,
    /// Seconds between the previous turn's finish and this one (0 for the first).
    pub think_s: f64,
    /// Id of the previous turn; `None` for the first.
    pub after: Option<u64>,
}

/// FNV-1a of a string, mixed: the seed of a tenant's system prompt (from its
/// `system_prompt_key`, or its name).
pub fn text_seed(key: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    splitmix(h)
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The first token id content uses: clear of the low ids models reserve for special tokens.
const FIRST_ID: u32 = 1000;
/// Content ids are drawn from `FIRST_ID..FIRST_ID + ID_RANGE` (inside any 32k vocabulary).
const ID_RANGE: u64 = 30_000;

/// `n` token ids drawn from `seed` (the twin's content).
pub fn token_ids(seed: u64, n: u32) -> Vec<u32> {
    let mut state = seed;
    (0..n)
        .map(|_| {
            state = splitmix(state);
            FIRST_ID + (state % ID_RANGE) as u32
        })
        .collect()
}

/// Common English words, one token each in the usual tokenizers (with the leading space).
const WORDS: &[&str] = &[
    "the", "of", "and", "to", "in", "is", "that", "it", "for", "on", "with", "as", "was", "at",
    "by", "be", "this", "from", "or", "have", "not", "are", "but", "one", "all", "can", "we",
    "more", "time", "new", "other", "some", "what", "when", "about", "also", "could", "first",
    "like", "make", "people", "use", "way", "work", "year", "day", "good", "just", "know", "long",
    "man", "much", "need", "number", "part", "place", "right", "same", "say", "see", "small",
    "system", "take", "than", "then", "there", "think", "water", "well", "world", "write", "word",
    "answer", "city", "data", "house", "light", "list", "model", "name", "paper", "point", "power",
    "question", "river", "school", "story", "table", "test", "text", "tree", "value", "voice",
    "window", "music", "number", "garden", "market", "energy", "science", "planet", "simple",
    "friend", "country", "road", "change", "family", "mountain",
];

/// `n` words drawn from `seed` (the HTTP target's content: about `n` tokens).
pub fn words(seed: u64, n: u32) -> String {
    let mut state = seed;
    let mut s = String::new();
    for i in 0..n {
        state = splitmix(state);
        if i > 0 {
            s.push(' ');
        }
        s.push_str(WORDS[(state % WORDS.len() as u64) as usize]);
    }
    s
}

/// The twin's prompt of a first turn (or a single request): system prompt ids, then the
/// message's.
pub fn first_prompt_ids(system_seed: u64, system_tokens: u32, msg_seed: u64, msg: u32) -> Vec<u32> {
    let mut p = token_ids(system_seed, system_tokens);
    p.extend(token_ids(msg_seed, msg));
    p
}

/// The twin's prompt of a follow-up turn: exactly the previous prompt, the answer the engine
/// produced, then the new message.
pub fn next_prompt_ids(prev: &[u32], answer: &[u32], msg_seed: u64, msg: u32) -> Vec<u32> {
    let mut p = Vec::with_capacity(prev.len() + answer.len() + msg as usize);
    p.extend_from_slice(prev);
    p.extend_from_slice(answer);
    p.extend(token_ids(msg_seed, msg));
    p
}

/// The HTTP target's prompt of a first turn: the system prompt's words, then the user message
/// in a plain chat frame that ends where the answer starts.
pub fn first_prompt_text(system_seed: u64, system_tokens: u32, msg_seed: u64, msg: u32) -> String {
    let mut s = String::new();
    if system_tokens > 0 {
        s.push_str(&words(system_seed, system_tokens));
        s.push_str("\n\n");
    }
    push_user(&mut s, msg_seed, msg);
    s
}

/// The HTTP target's prompt of a follow-up: exactly the previous prompt, the text the server
/// returned, then the new message.
pub fn next_prompt_text(prev: &str, answer: &str, msg_seed: u64, msg: u32) -> String {
    let mut s = String::with_capacity(prev.len() + answer.len() + 8 * msg as usize);
    s.push_str(prev);
    s.push_str(answer);
    s.push_str("\n\n");
    push_user(&mut s, msg_seed, msg);
    s
}

fn push_user(s: &mut String, msg_seed: u64, msg: u32) {
    s.push_str("User: ");
    s.push_str(&words(msg_seed, msg));
    s.push_str("\nAssistant:");
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn turns_have_the_mean_asked_for_and_the_cap() {
        let spec = ConversationSpec::new(2.0, 10.0);
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let n = 100_000;
        let turns: Vec<u32> = (0..n).map(|_| spec.sample_turns(&mut rng)).collect();
        let mean = turns.iter().map(|&t| f64::from(t)).sum::<f64>() / n as f64;
        assert!((mean - 2.0).abs() < 0.03, "{mean}");
        let ones = turns.iter().filter(|&&t| t == 1).count() as f64 / n as f64;
        assert!((ones - 0.5).abs() < 0.01, "P(1 turn) = 1/mean: {ones}");
        let capped = ConversationSpec {
            max_turns: 3,
            ..spec
        };
        assert!((0..1000).all(|_| capped.sample_turns(&mut rng) <= 3));
        assert_eq!(ConversationSpec::new(1.0, 0.0).sample_turns(&mut rng), 1);
        let think = (0..n).map(|_| spec.sample_think_s(&mut rng)).sum::<f64>() / n as f64;
        assert!((think - 10.0).abs() < 0.2, "{think}");
    }

    #[test]
    fn bad_specs_are_refused() {
        assert!(ConversationSpec::new(0.5, 1.0).validate().is_err());
        assert!(ConversationSpec::new(2.0, -1.0).validate().is_err());
        assert!(ConversationSpec::new(f64::NAN, 1.0).validate().is_err());
        assert!(ConversationSpec::new(1.0, 0.0).validate().is_ok());
    }

    #[test]
    fn content_is_deterministic_and_seed_specific() {
        assert_eq!(token_ids(5, 40), token_ids(5, 40));
        assert_ne!(token_ids(5, 40), token_ids(6, 40));
        assert_eq!(token_ids(5, 40)[..10], token_ids(5, 10)[..]);
        assert!(token_ids(9, 1000).iter().all(|&t| t >= FIRST_ID));
        assert_eq!(words(3, 25).split(' ').count(), 25);
        assert_ne!(words(3, 25), words(4, 25));
        assert_eq!(text_seed("gold"), text_seed("gold"));
        assert_ne!(text_seed("gold"), text_seed("bronze"));
    }

    #[test]
    fn a_follow_up_prompt_starts_with_the_previous_prompt_and_answer() {
        let first = first_prompt_ids(text_seed("t"), 64, 11, 20);
        assert_eq!(first.len(), 84);
        assert_eq!(first[..64], token_ids(text_seed("t"), 64)[..]);
        let answer = vec![7u32; 30];
        let next = next_prompt_ids(&first, &answer, 12, 10);
        assert_eq!(next[..84], first[..]);
        assert_eq!(next[84..114], answer[..]);
        assert_eq!(next.len(), 124);
        let t0 = first_prompt_text(text_seed("t"), 50, 11, 20);
        assert!(t0.starts_with(&words(text_seed("t"), 50)));
        let t1 = next_prompt_text(&t0, " an answer", 12, 10);
        assert!(t1.starts_with(&format!("{t0} an answer\n\nUser: ")));
        assert!(t1.ends_with("\nAssistant:"));
    }
}
