//! The figures of a `step_finish` event read by a strict scan, without serde: opencode
//! writes the event as `JSON.stringify` does — no whitespace, plain ASCII keys and ids —
//! so the scan walks that shape byte by byte, skipping the values it does not need
//! (ids, the reason, the timestamp) without decoding them, and reads only the step's
//! `cost` and `tokens`.
//!
//! It is a fast path, never a second opinion: it answers only for text in that plain
//! shape, and whenever it answers, the answer is the one serde would give (the
//! figures, and the bytes the event took). Anything else — whitespace, an escape or a
//! byte outside printable ASCII in a string, an exponent in a skipped number, a
//! duplicate key, a value of another type where a figure or an object is expected,
//! deep nesting, text that ends or breaks — gets `None`, and the caller parses the
//! event with serde as before, which decides. The event is attacker text (a tool can
//! write to opencode's stdout), so the tests compare the two on hostile and mutated
//! lines.

/// What a `step_finish` says the step used: JSON numbers as serde reads them into
/// `f64` (a missing figure is 0).
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub(super) struct Figures {
    /// `part.cost`, USD.
    pub cost: f64,
    /// `part.tokens.input`.
    pub input: f64,
    /// `part.tokens.output`.
    pub output: f64,
    /// `part.tokens.reasoning`.
    pub reasoning: f64,
    /// `part.tokens.cache.read`.
    pub read: f64,
    /// `part.tokens.cache.write`.
    pub write: f64,
}

use super::scan::{Scan, once};

/// Longest run of digits read as an integer here: up to 15 digits is exact in an
/// `f64`, as serde's `u64 as f64` is.
const MAX_PLAIN_DIGITS: usize = 15;

/// Reads the `step_finish` event at the start of `text` (its first byte is `{`): its
/// figures and the bytes it took, or `None` when it is not in the plain shape (then
/// serde decides).
pub(super) fn read(text: &[u8]) -> Option<(Figures, usize)> {
    let mut s = Scan { b: text, i: 0 };
    let mut f = Figures::default();
    let mut part = false;
    s.object(0, |s, key| {
        if key == b"part" {
            if part {
                return None;
            }
            part = true;
            s.part(&mut f)?;
            Some(true)
        } else {
            Some(false)
        }
    })?;
    // serde's `StepFinish` has no default for `part`.
    part.then_some((f, s.i))
}

impl Scan<'_> {
    /// The step-finish part: `cost` and `tokens`, each at most once.
    fn part(&mut self, f: &mut Figures) -> Option<()> {
        let (mut cost, mut tokens) = (false, false);
        self.object(1, |s, key| match key {
            b"cost" => {
                once(&mut cost)?;
                f.cost = s.figure()?;
                Some(true)
            }
            b"tokens" => {
                once(&mut tokens)?;
                s.tokens(f)?;
                Some(true)
            }
            _ => Some(false),
        })
    }

    /// The step's tokens: `input`, `output`, `reasoning`, `cache`, each at most once.
    fn tokens(&mut self, f: &mut Figures) -> Option<()> {
        let mut seen = [false; 4];
        self.object(2, |s, key| {
            match key {
                b"input" => {
                    once(&mut seen[0])?;
                    f.input = s.figure()?;
                }
                b"output" => {
                    once(&mut seen[1])?;
                    f.output = s.figure()?;
                }
                b"reasoning" => {
                    once(&mut seen[2])?;
                    f.reasoning = s.figure()?;
                }
                b"cache" => {
                    once(&mut seen[3])?;
                    s.cache(f)?;
                }
                _ => return Some(false),
            }
            Some(true)
        })
    }

    /// The cache tokens: `read` and `write`, each at most once.
    fn cache(&mut self, f: &mut Figures) -> Option<()> {
        let (mut read, mut write) = (false, false);
        self.object(3, |s, key| match key {
            b"read" => {
                once(&mut read)?;
                f.read = s.figure()?;
                Some(true)
            }
            b"write" => {
                once(&mut write)?;
                f.write = s.figure()?;
                Some(true)
            }
            _ => Some(false),
        })
    }

    /// A figure: a JSON number as serde reads it into an `f64` — a plain integer of up
    /// to 15 digits here (exact either way), anything else by serde_json itself.
    fn figure(&mut self) -> Option<f64> {
        let n = self.number()?;
        if n.len() <= MAX_PLAIN_DIGITS && n.iter().all(u8::is_ascii_digit) {
            let v = n.iter().fold(0u64, |v, d| v * 10 + u64::from(d - b'0'));
            // At most 15 digits: exact in an f64.
            return Some(v as f64);
        }
        serde_json::from_slice::<f64>(n).ok()
    }
}

#[cfg(test)]
#[path = "usage_step_tests.rs"]
mod tests;
