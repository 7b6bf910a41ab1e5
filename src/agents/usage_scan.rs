//! The strict byte scan the live usage meter reads opencode's plain events with
//! (`usage_step.rs`: `step_finish`, `usage_tool.rs`: `tool_use`): opencode writes each
//! event as `JSON.stringify` does — no whitespace, plain ASCII keys and ids — and this
//! cursor walks that shape only. Every method answers `None` for anything else, and
//! the caller then leaves the event to serde, which decides.

/// Deepest nesting the scan follows (serde_json's own limit is 128: deeper text goes
/// to serde, which decides).
pub(super) const MAX_DEPTH: usize = 64;

/// A cursor over the event's bytes.
pub(super) struct Scan<'a> {
    /// The text.
    pub b: &'a [u8],
    /// The next byte to read.
    pub i: usize,
}

impl<'a> Scan<'a> {
    /// The next byte, not taken.
    pub(super) fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    /// Takes byte `c`, which must come next.
    pub(super) fn eat(&mut self, c: u8) -> Option<()> {
        (self.peek()? == c).then(|| self.i += 1)
    }

    /// An object: `{`, then for each key `on_key` (after its `:`), which reads the
    /// value itself and says `Some(true)`, or says `Some(false)` to have it skipped;
    /// `None` anywhere ends the scan.
    pub(super) fn object(
        &mut self,
        depth: usize,
        mut on_key: impl FnMut(&mut Self, &'a [u8]) -> Option<bool>,
    ) -> Option<()> {
        if depth >= MAX_DEPTH {
            return None;
        }
        self.eat(b'{')?;
        if self.eat(b'}').is_some() {
            return Some(());
        }
        loop {
            let key = self.string()?;
            self.eat(b':')?;
            if !on_key(self, key)? {
                self.skip(depth + 1)?;
            }
            match self.peek()? {
                b',' => self.i += 1,
                b'}' => {
                    self.i += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// A JSON number (its grammar exactly: `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`);
    /// its bytes.
    pub(super) fn number(&mut self) -> Option<&'a [u8]> {
        let start = self.i;
        let _ = self.eat(b'-');
        match self.peek()? {
            // serde refuses a digit after a leading 0 as it reads the number.
            b'0' if !self.b.get(self.i + 1).is_some_and(u8::is_ascii_digit) => self.i += 1,
            b'1'..=b'9' => self.digits(),
            _ => return None,
        }
        if self.eat(b'.').is_some() {
            self.peek().filter(u8::is_ascii_digit)?;
            self.digits();
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.i += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.i += 1;
            }
            self.peek().filter(u8::is_ascii_digit)?;
            self.digits();
        }
        Some(&self.b[start..self.i])
    }

    /// Takes a run of digits.
    pub(super) fn digits(&mut self) {
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.i += 1;
        }
    }

    /// A string of printable ASCII without escapes; its bytes (between the quotes).
    pub(super) fn string(&mut self) -> Option<&'a [u8]> {
        self.eat(b'"')?;
        let rest = &self.b[self.i..];
        // One pass to the first byte that is not plain (the strings here are short:
        // keys, ids, names).
        let len = rest
            .iter()
            .position(|&c| c == b'"' || c == b'\\' || !(0x20..0x7f).contains(&c))?;
        if rest[len] != b'"' {
            return None;
        }
        self.i += len + 1;
        Some(&rest[..len])
    }

    /// Skips one value: an object, an array, a string, a number without an exponent,
    /// `true`, `false` or `null`.
    pub(super) fn skip(&mut self, depth: usize) -> Option<()> {
        match self.peek()? {
            b'{' => self.object(depth, |_, _| Some(false)),
            b'[' => {
                if depth >= MAX_DEPTH {
                    return None;
                }
                self.i += 1;
                if self.eat(b']').is_some() {
                    return Some(());
                }
                loop {
                    self.skip(depth + 1)?;
                    match self.peek()? {
                        b',' => self.i += 1,
                        b']' => {
                            self.i += 1;
                            return Some(());
                        }
                        _ => return None,
                    }
                }
            }
            b'"' => self.string().map(drop),
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            _ => {
                let n = self.number()?;
                // How serde treats an exponent it skips is its business.
                (!n.iter().any(|c| matches!(c, b'e' | b'E'))).then_some(())
            }
        }
    }

    /// Takes the literal `word`.
    pub(super) fn literal(&mut self, word: &[u8]) -> Option<()> {
        let end = self.i + word.len();
        (self.b.get(self.i..end)? == word).then(|| self.i = end)
    }
}

/// Marks a key seen; `None` when it already was (serde refuses a duplicate field).
pub(super) fn once(seen: &mut bool) -> Option<()> {
    (!std::mem::replace(seen, true)).then_some(())
}

/// Mutated copies of event lines for the scans' tests: a fixed pseudo-random walk (no
/// dependency, the same every run) that changes, removes, inserts (from `alphabet`) or
/// copies bytes, `per_base` lines from each of `bases`; `check` gets each line.
#[cfg(test)]
pub(super) fn mutations(
    bases: &[&str],
    per_base: usize,
    alphabet: &[u8],
    mut check: impl FnMut(&[u8]),
) {
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move |n: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        usize::try_from(state % n as u64).expect("small")
    };
    for base in bases {
        for _ in 0..per_base {
            let mut line = base.as_bytes().to_vec();
            for _ in 0..=next(3) {
                let at = next(line.len());
                match next(4) {
                    0 => line[at] = alphabet[next(alphabet.len())],
                    1 => {
                        line.remove(at);
                    }
                    2 => line.insert(at, alphabet[next(alphabet.len())]),
                    _ => {
                        let end = (at + 1 + next(12)).min(line.len());
                        let copy = line[at..end].to_vec();
                        let to = next(line.len());
                        line.splice(to..to, copy);
                    }
                }
            }
            check(&line);
        }
    }
}
