//! A streamed answer split as [`parse`] splits a whole one, sent as OpenAI streams tool calls:
//! text before a call streams as content; a Hermes call of the plain shape
//! `{"name": "f", "arguments": {…}}` opens with one delta (its index, id and name) as soon as
//! the name is complete, then its arguments stream in pieces as the model writes them (the
//! pieces concatenate to the model's JSON text of the arguments). A call of any other shape
//! (`arguments` before `name`, arguments given as a string) and every Llama-form call is sent
//! whole once it is complete, as one delta.

use super::parse::{parse, parse_hermes, Parsed, ToolCall, CLOSE, OPEN, PYTHON_TAG};
use super::{Tool, ToolFormat};

/// What a streamed answer sends next.
#[derive(Clone, Debug, PartialEq)]
pub enum ToolStreamEvent {
    Content(String),
    /// A whole call, in one delta.
    Call(ToolCall),
    /// A call opens: its id and name (`arguments` empty); its arguments follow.
    CallStart(ToolCall),
    /// The next piece of the open call's arguments.
    CallArgs(String),
}

/// Where an open Hermes call is (the text after `<tool_call>` is in `held`).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Open {
    /// Not in a call.
    No,
    /// In a call whose head (`{"name": …, "arguments": {`) is not complete yet.
    Head,
    /// Streaming the arguments: `sent` bytes of `held` are out, at this nesting depth.
    Args {
        sent: usize,
        depth: u32,
        in_str: bool,
        esc: bool,
    },
    /// The arguments are out; the rest of the call (`}` and space) is dropped at its close.
    Tail,
    /// A call of another shape: sent whole at its close.
    Whole,
}

/// Splits a streamed answer as [`parse`] splits a whole one.
#[derive(Clone, Debug)]
pub struct ToolStream {
    format: ToolFormat,
    tools: Vec<Tool>,
    /// Text not yet sent: a possible start of a call, or a call still open.
    held: String,
    open: Open,
    /// Llama form: the answer began as a call, so all of it waits for the end.
    whole: bool,
    started: bool,
}

/// How far the head of a call has come.
enum Head<'a> {
    Incomplete,
    NoMatch,
    /// The name, and the offset of the arguments' `{`.
    Match(&'a str, usize),
}

/// Reads `{"name": "<name>", "arguments": {` (any whitespace between) at the start of `s`.
fn head(s: &str) -> Head<'_> {
    let b = s.as_bytes();
    let mut at = 0;
    let ws = |at: &mut usize| {
        while *at < b.len() && b[*at].is_ascii_whitespace() {
            *at += 1;
        }
    };
    // Expects `lit` at `at` (after whitespace); `Err` with the outcome when it is not there.
    let expect = |at: &mut usize, lit: &str| -> Result<(), bool> {
        ws(at);
        let rest = &b[*at..];
        if rest.len() < lit.len() {
            // Incomplete if what is there could still become `lit`.
            return Err(lit.as_bytes().starts_with(rest));
        }
        if &rest[..lit.len()] != lit.as_bytes() {
            return Err(false);
        }
        *at += lit.len();
        Ok(())
    };
    let verdict = |incomplete: bool| {
        if incomplete {
            Head::Incomplete
        } else {
            Head::NoMatch
        }
    };
    for lit in ["{", "\"name\"", ":", "\""] {
        if let Err(i) = expect(&mut at, lit) {
            return verdict(i);
        }
    }
    let name_start = at;
    while at < b.len() && b[at] != b'"' {
        if b[at] == b'\\' {
            return Head::NoMatch;
        }
        at += 1;
    }
    if at == b.len() {
        return Head::Incomplete;
    }
    let name = &s[name_start..at];
    at += 1;
    for lit in [",", "\"arguments\"", ":", "{"] {
        if let Err(i) = expect(&mut at, lit) {
            return verdict(i);
        }
    }
    Head::Match(name, at - 1)
}

impl ToolStream {
    pub fn new(format: ToolFormat, tools: Vec<Tool>) -> ToolStream {
        ToolStream {
            format,
            tools,
            held: String::new(),
            open: Open::No,
            whole: false,
            started: false,
        }
    }

    /// A whole answer, split ([`parse`] with this stream's format and tools).
    pub fn parse_whole(&self, text: &str) -> Parsed {
        parse(text, self.format, &self.tools)
    }

    /// What `piece` (the next text of the answer) lets out now.
    pub fn push(&mut self, piece: &str) -> Vec<ToolStreamEvent> {
        self.held.push_str(piece);
        match self.format {
            ToolFormat::Llama3Json => self.push_llama(),
            ToolFormat::Hermes => self.push_hermes(),
        }
    }

    fn push_llama(&mut self) -> Vec<ToolStreamEvent> {
        if !self.started {
            let t = self.held.trim_start();
            if t.is_empty() || (PYTHON_TAG.starts_with(t) && t.len() < PYTHON_TAG.len()) {
                return Vec::new();
            }
            self.started = true;
            self.whole = t.starts_with('{') || t.starts_with(PYTHON_TAG);
        }
        if self.whole {
            return Vec::new();
        }
        vec![ToolStreamEvent::Content(std::mem::take(&mut self.held))]
    }

    fn push_hermes(&mut self) -> Vec<ToolStreamEvent> {
        let mut out = Vec::new();
        loop {
            if self.open != Open::No {
                if !self.in_call(&mut out) {
                    return out;
                }
                continue;
            }
            if let Some(start) = self.held.find(OPEN) {
                if start > 0 {
                    out.push(ToolStreamEvent::Content(self.held[..start].to_string()));
                }
                self.held.drain(..start + OPEN.len());
                self.open = Open::Head;
                continue;
            }
            // Hold back a tail that could still become `<tool_call>`.
            let keep = (1..OPEN.len())
                .rev()
                .find(|&k| self.held.len() >= k && self.held.ends_with(&OPEN[..k]))
                .unwrap_or(0);
            let send = self.held.len() - keep;
            if send > 0 && self.held.is_char_boundary(send) {
                out.push(ToolStreamEvent::Content(self.held[..send].to_string()));
                self.held.drain(..send);
            }
            return out;
        }
    }

    /// Advances the open call over `held` (the text after its `<tool_call>`); true when the
    /// call closed (and `held` is what follows it).
    fn in_call(&mut self, out: &mut Vec<ToolStreamEvent>) -> bool {
        if self.open == Open::Head {
            match head(&self.held) {
                Head::Incomplete if !self.held.contains(CLOSE) => return false,
                Head::Match(name, brace) if self.tools.iter().any(|t| t.name == name) => {
                    out.push(ToolStreamEvent::CallStart(ToolCall::opening(name)));
                    self.open = Open::Args {
                        sent: brace,
                        depth: 0,
                        in_str: false,
                        esc: false,
                    };
                }
                _ => self.open = Open::Whole,
            }
        }
        if let Open::Args {
            sent,
            mut depth,
            mut in_str,
            mut esc,
        } = self.open
        {
            let mut end = None;
            for (i, c) in self.held[sent..].char_indices() {
                match (in_str, esc, c) {
                    (true, true, _) => esc = false,
                    (true, false, '\\') => esc = true,
                    (true, false, '"') => in_str = false,
                    (true, false, _) => {}
                    (false, _, '"') => in_str = true,
                    (false, _, '{' | '[') => depth += 1,
                    (false, _, '}' | ']') => {
                        depth = depth.saturating_sub(1);
                        if depth == 0 {
                            end = Some(sent + i + 1);
                            break;
                        }
                    }
                    _ => {}
                }
            }
            // Never send what could be the start of `</tool_call>` inside a broken call.
            let upto = end.unwrap_or(self.held.len());
            let upto = match self.held[sent..upto].find(CLOSE) {
                Some(c) => sent + c,
                None => upto,
            };
            if upto > sent {
                out.push(ToolStreamEvent::CallArgs(self.held[sent..upto].to_string()));
            }
            self.open = match end {
                Some(_) => Open::Tail,
                None => Open::Args {
                    sent: upto,
                    depth,
                    in_str,
                    esc,
                },
            };
        }
        let Some(close) = self.held.find(CLOSE) else {
            return false;
        };
        if self.open == Open::Whole {
            let block = format!("{OPEN}{}", &self.held[..close + CLOSE.len()]);
            let p = parse_hermes(&block, &self.tools);
            out.push(match p.calls.into_iter().next() {
                Some(c) => ToolStreamEvent::Call(c),
                None => ToolStreamEvent::Content(block),
            });
        }
        self.held.drain(..close + CLOSE.len());
        self.open = Open::No;
        true
    }

    /// The end of the answer: whatever is held, parsed.
    pub fn finish(&mut self) -> Vec<ToolStreamEvent> {
        let held = std::mem::take(&mut self.held);
        match std::mem::replace(&mut self.open, Open::No) {
            // A streamed call cut short (or without its close): what it sent is what it has.
            Open::Args { .. } | Open::Tail => return Vec::new(),
            Open::Head | Open::Whole => {
                return self.finish_text(format!("{OPEN}{held}"));
            }
            Open::No => {}
        }
        self.finish_text(held)
    }

    fn finish_text(&self, held: String) -> Vec<ToolStreamEvent> {
        if held.is_empty() {
            return Vec::new();
        }
        let p = parse(&held, self.format, &self.tools);
        let mut out = Vec::new();
        if !p.content.is_empty() || p.calls.is_empty() {
            // A held tail that was no call goes out as it was.
            out.push(ToolStreamEvent::Content(if p.calls.is_empty() {
                held
            } else {
                p.content
            }));
        }
        out.extend(p.calls.into_iter().map(ToolStreamEvent::Call));
        out
    }
}
