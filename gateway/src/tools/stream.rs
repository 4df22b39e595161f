//! A streamed answer split as [`parse`] splits a whole one, sent as OpenAI streams tool calls:
//! text before a call streams as content; a call of the plain shape — Hermes
//! `<tool_call>{"name": "f", "arguments": {…}}</tool_call>`, Llama 3.1
//! `{"name": "f", "parameters": {…}}` (`; `-separated, after an optional `<|python_tag|>`) —
//! opens with one delta (its index, id and name) as soon as the name is complete, then its
//! arguments stream in pieces as the model writes them (the pieces concatenate to the model's
//! JSON text of the arguments). A call of any other shape (arguments before `name`, arguments
//! given as a string) is sent whole once it is complete, as one delta; a Llama-form answer
//! that does not start as such a call is parsed whole at its end.

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
    /// Streaming the arguments: `sent` bytes of `held` are out.
    Args { sent: usize, scan: Scan },
    /// The arguments are out; the rest of the call (`}` and space) is dropped at its close.
    Tail,
    /// A call of another shape: sent whole at its close.
    Whole,
}

/// Where a Llama-form answer is (`held` is what is not sent yet).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Llama {
    /// Nothing decided yet (leading space, or a part of `<|python_tag|>`).
    Start,
    /// Text: it streams as content.
    Text,
    /// Calls: the next one's head is not complete yet.
    Head,
    /// Streaming a call's parameters: `sent` bytes of `held` are out.
    Args { sent: usize, scan: Scan },
    /// After a streamed call: `}` and space, then `;` and the next call, or the end.
    Between,
    /// Not of the streamable shape: all of it waits for the end, parsed whole.
    Whole,
}

/// How far a JSON value has come: its nesting depth, and whether a string (and an escape in
/// it) is open.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Scan {
    depth: u32,
    in_str: bool,
    esc: bool,
}

impl Scan {
    /// Reads `s` (the value's next text, from its opening `{` on); the offset just past the
    /// bracket that closes the value, if it is in `s`.
    fn read(&mut self, s: &str) -> Option<usize> {
        for (i, c) in s.char_indices() {
            match (self.in_str, self.esc, c) {
                (true, true, _) => self.esc = false,
                (true, false, '\\') => self.esc = true,
                (true, false, '"') => self.in_str = false,
                (true, false, _) => {}
                (false, _, '"') => self.in_str = true,
                (false, _, '{' | '[') => self.depth += 1,
                (false, _, '}' | ']') => {
                    self.depth = self.depth.saturating_sub(1);
                    if self.depth == 0 {
                        return Some(i + 1);
                    }
                }
                _ => {}
            }
        }
        None
    }
}

/// Splits a streamed answer as [`parse`] splits a whole one.
#[derive(Clone, Debug)]
pub struct ToolStream {
    format: ToolFormat,
    tools: Vec<Tool>,
    /// Text not yet sent: a possible start of a call, or a call still open.
    held: String,
    open: Open,
    llama: Llama,
    /// Llama form: what was dropped before the first call (space, `<|python_tag|>`), put
    /// back if the answer turns out not to be calls of the streamable shape.
    lead: String,
    /// Llama form: calls streamed so far.
    streamed: u32,
}

/// How far the head of a call has come.
enum Head<'a> {
    Incomplete,
    NoMatch,
    /// The name, and the offset of the arguments' `{`.
    Match(&'a str, usize),
}

/// Reads `{"name": "<name>", "<key>": {` (any whitespace between) at the start of `s`.
fn head<'a>(s: &'a str, key: &str) -> Head<'a> {
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
    let key = format!("\"{key}\"");
    for lit in [",", key.as_str(), ":", "{"] {
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
            llama: Llama::Start,
            lead: String::new(),
            streamed: 0,
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
        let mut out = Vec::new();
        loop {
            match self.llama {
                Llama::Start => {
                    let t = self.held.trim_start();
                    if t.is_empty() || (PYTHON_TAG.starts_with(t) && t.len() < PYTHON_TAG.len()) {
                        return out;
                    }
                    if t.starts_with('{') || t.starts_with(PYTHON_TAG) {
                        let tag = if t.starts_with(PYTHON_TAG) {
                            PYTHON_TAG.len()
                        } else {
                            0
                        };
                        let skip = self.held.len() - t.len() + tag;
                        self.lead = self.held.drain(..skip).collect();
                        self.llama = Llama::Head;
                    } else {
                        self.llama = Llama::Text;
                    }
                }
                Llama::Text => {
                    if !self.held.is_empty() {
                        out.push(ToolStreamEvent::Content(std::mem::take(&mut self.held)));
                    }
                    return out;
                }
                Llama::Head => match head(self.held.trim_start(), "parameters") {
                    Head::Incomplete => return out,
                    Head::Match(name, brace) if self.tools.iter().any(|t| t.name == name) => {
                        out.push(ToolStreamEvent::CallStart(ToolCall::opening(name)));
                        let sent = self.held.len() - self.held.trim_start().len() + brace;
                        self.streamed += 1;
                        self.llama = Llama::Args {
                            sent,
                            scan: Scan::default(),
                        };
                    }
                    _ if self.streamed == 0 => {
                        // Not a call of the streamable shape: parsed whole at the end.
                        self.held.insert_str(0, &std::mem::take(&mut self.lead));
                        self.llama = Llama::Whole;
                    }
                    // After streamed calls, what is not another call is text.
                    _ => self.llama = Llama::Text,
                },
                Llama::Args { sent, mut scan } => {
                    let end = scan.read(&self.held[sent..]).map(|e| sent + e);
                    let upto = end.unwrap_or(self.held.len());
                    if upto > sent {
                        out.push(ToolStreamEvent::CallArgs(self.held[sent..upto].to_string()));
                    }
                    match end {
                        Some(e) => {
                            self.held.drain(..e);
                            self.llama = Llama::Between;
                        }
                        None => {
                            self.llama = Llama::Args { sent: upto, scan };
                            return out;
                        }
                    }
                }
                Llama::Between => {
                    let t = self
                        .held
                        .trim_start_matches(|c: char| c.is_whitespace() || c == '}');
                    if t.is_empty() {
                        self.held.clear();
                        return out;
                    }
                    match t.strip_prefix(';') {
                        Some(rest) => {
                            self.held = rest.to_string();
                            self.llama = Llama::Head;
                        }
                        None => {
                            self.held = t.to_string();
                            self.llama = Llama::Text;
                        }
                    }
                }
                Llama::Whole => return out,
            }
        }
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
            match head(&self.held, "arguments") {
                Head::Incomplete if !self.held.contains(CLOSE) => return false,
                Head::Match(name, brace) if self.tools.iter().any(|t| t.name == name) => {
                    out.push(ToolStreamEvent::CallStart(ToolCall::opening(name)));
                    self.open = Open::Args {
                        sent: brace,
                        scan: Scan::default(),
                    };
                }
                _ => self.open = Open::Whole,
            }
        }
        if let Open::Args { sent, mut scan } = self.open {
            let end = scan.read(&self.held[sent..]).map(|e| sent + e);
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
                None => Open::Args { sent: upto, scan },
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
        if self.format == ToolFormat::Llama3Json {
            return match std::mem::replace(&mut self.llama, Llama::Text) {
                // A call cut short: what it sent is what it has.
                Llama::Args { .. } | Llama::Between => Vec::new(),
                Llama::Head if self.streamed > 0 => Vec::new(),
                Llama::Start | Llama::Head | Llama::Whole => {
                    let lead = std::mem::take(&mut self.lead);
                    self.finish_text(lead + &held)
                }
                Llama::Text => self.finish_text(held),
            };
        }
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
