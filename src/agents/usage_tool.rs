//! The call of a `tool_use` event read by a strict scan, without serde: opencode writes
//! a tool part as `JSON.stringify` does — `{"type":"tool_use",…,"part":{"id",…,
//! "tool":NAME,…,"state":{"status",…,"input":{…},"output":"…",…}}}`, no whitespace,
//! plain ASCII keys and ids — so the scan walks that shape byte by byte from the
//! event's `{`, skipping what it does not need without decoding it, takes the tool's
//! name and the exact bytes of its arguments (`input`, any JSON value), and **stops as
//! soon as both are known**, before the tool's output (often kilobytes), as
//! [`tool_call::read`](super::tool_call::read) does.
//!
//! It is a fast path, never a second opinion: it answers only for text in that plain
//! shape, and whenever it answers, the answer is the one `tool_call::read` gives (the
//! name, and the input's raw text). Anything else — whitespace, an escape or a byte
//! outside printable ASCII in a key, a skipped value or the name, a duplicate `part`,
//! `tool`, `state` or `input` before both are known, a value of another type, an
//! exponent in a skipped number, deep nesting, text that ends or breaks, an event that
//! ends before both are known — gets `None`, and the caller reads the event with
//! `tool_call::read`, which decides. Inside `input` strings may hold escapes and UTF-8
//! (the model's own arguments often do), validated as serde validates a raw value:
//! valid escapes, no control byte, and the whole input valid UTF-8.

use super::scan::{MAX_DEPTH, Scan, once};

/// Reads the call of the `tool_use` event at the start of `text` (its first byte is
/// `{`): the tool's name and its arguments' JSON text, or `None` when the event is not
/// in the plain shape or ends before both are known (then `tool_call::read` decides).
pub(super) fn read(text: &[u8]) -> Option<(&str, &str)> {
    let mut s = Scan { b: text, i: 0 };
    let mut call = Found::default();
    let mut part = false;
    // `None` comes back both when the shape breaks and when the call is known: `done`
    // tells them apart.
    let _ = s.object(0, |s, key| {
        if key != b"part" {
            return Some(false);
        }
        once(&mut part)?;
        s.tool_part(&mut call)?;
        Some(true)
    });
    if !call.done {
        return None;
    }
    // Both were taken from the text: the name is printable ASCII, the input checked.
    let tool = std::str::from_utf8(call.tool?).ok()?;
    let input = std::str::from_utf8(call.input?).ok()?;
    Some((tool, input))
}

/// What is known of the call so far.
#[derive(Default)]
struct Found<'a> {
    /// `part.tool`'s text (between its quotes).
    tool: Option<&'a [u8]>,
    /// `part.state.input`'s text.
    input: Option<&'a [u8]>,
    /// Both are known: the scan stopped there.
    done: bool,
}

impl Found<'_> {
    /// Marks the call known when both parts are; `None` then, to stop the scan.
    fn stop_when_known(&mut self) -> Option<bool> {
        if self.tool.is_some() && self.input.is_some() {
            self.done = true;
            return None;
        }
        Some(true)
    }
}

impl<'a> Scan<'a> {
    /// The tool part: `tool` (a plain string) and `state`, each at most once.
    fn tool_part(&mut self, call: &mut Found<'a>) -> Option<()> {
        let (mut tool, mut state) = (false, false);
        self.object(1, |s, key| match key {
            b"tool" => {
                once(&mut tool)?;
                call.tool = Some(s.string()?);
                call.stop_when_known()
            }
            b"state" => {
                once(&mut state)?;
                s.tool_state(call)?;
                call.stop_when_known()
            }
            _ => Some(false),
        })
    }

    /// The part's state: `input`, at most once.
    fn tool_state(&mut self, call: &mut Found<'a>) -> Option<()> {
        let mut input = false;
        self.object(2, |s, key| {
            if key != b"input" {
                return Some(false);
            }
            once(&mut input)?;
            let start = s.i;
            s.raw(3)?;
            call.input = Some(&s.b[start..s.i]);
            call.stop_when_known()
        })
    }

    /// Skips one value of the arguments as serde checks a raw value: like
    /// [`Scan::skip`], but its strings (keys too) may hold escapes and any byte but a
    /// control one (the caller checks the whole is UTF-8).
    fn raw(&mut self, depth: usize) -> Option<()> {
        let (open, close) = match self.peek()? {
            b'{' => (b'{', b'}'),
            b'[' => (b'[', b']'),
            b'"' => return self.raw_string(),
            _ => return self.skip(depth),
        };
        if depth >= MAX_DEPTH {
            return None;
        }
        self.eat(open)?;
        if self.eat(close).is_some() {
            return Some(());
        }
        loop {
            if open == b'{' {
                self.raw_string()?;
                self.eat(b':')?;
            }
            self.raw(depth + 1)?;
            match self.peek()? {
                b',' => self.i += 1,
                c if c == close => {
                    self.i += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// A string as serde skips one: valid escapes (`\uXXXX` any four hex digits), no
    /// byte below 0x20.
    fn raw_string(&mut self) -> Option<()> {
        self.eat(b'"')?;
        loop {
            let start = self.i;
            let len = memchr::memchr2(b'"', b'\\', &self.b[start..])?;
            if self.b[start..start + len].iter().any(|&c| c < 0x20) {
                return None;
            }
            self.i = start + len + 1;
            if self.b[start + len] == b'"' {
                return Some(());
            }
            match self.peek()? {
                b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => self.i += 1,
                b'u' => {
                    let hex = self.b.get(self.i + 1..self.i + 5)?;
                    if !hex.iter().all(u8::is_ascii_hexdigit) {
                        return None;
                    }
                    self.i += 5;
                }
                _ => return None,
            }
        }
    }
}

#[cfg(test)]
#[path = "usage_tool_tests.rs"]
mod tests;
