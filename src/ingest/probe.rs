//! One validating pass over a webhook body: is it one JSON object (RFC 8259), nested
//! no deeper than [`MAX_NESTING`], and which repository does it name?
//!
//! Written by hand because it runs on every delivery, on bodies of ~15 KB that are
//! mostly string contents: the scanner jumps through strings eight bytes at a time
//! (SWAR: a word with no quote, backslash or control byte is skipped whole), keeps its
//! nesting in a fixed array (no allocation), and looks at keys only down to the depth
//! where the repository names live. UTF-8 is checked once over the whole body by the
//! standard library beforehand. Agreement with `serde_json` on what is JSON is checked
//! by a property test and by the `json_probe` fuzz harness.

use std::borrow::Cow;

/// Deepest accepted nesting of JSON arrays and objects, the top-level object included.
/// Forgejo's payloads stay under 10; the core parses with serde_json, whose own limit is
/// 128, so nothing deeper may be queued.
pub const MAX_NESTING: usize = 128;

/// What the probe found in a valid body.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Names<'a> {
    /// `repository.full_name` (every event except the Actions run events).
    pub top: Option<Cow<'a, str>>,
    /// `run.repository.full_name` (Actions run events, forgejo-facts §3.7).
    pub run: Option<Cow<'a, str>>,
}

/// Why a body is not a JSON object the ingest accepts, with the byte offset.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} at byte {at}")]
pub struct ProbeError {
    /// What was wrong.
    pub what: &'static str,
    /// Byte offset in the body.
    pub at: usize,
    /// The body may well be JSON, but not one the ingest takes: nested deeper than
    /// [`MAX_NESTING`], or a field on a repository path repeated, mistyped or with an
    /// escape that names no string. `false`: the body is not JSON at all.
    pub refused: bool,
}

/// The keys on the paths to the two repository names.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Key {
    Repository,
    Run,
    FullName,
    Other,
}

/// A word of eight bytes with `b` in every byte.
const fn splat(b: u8) -> u64 {
    u64::from_ne_bytes([b; 8])
}

const LO: u64 = splat(0x01);
const HI: u64 = splat(0x80);

/// High bit set in (at least) the lowest byte of `w` that is a quote, a backslash or
/// below 0x20; exact for the lowest such byte, which is all the scanner uses.
#[inline]
fn specials(w: u64) -> u64 {
    let quote = w ^ splat(b'"');
    let slash = w ^ splat(b'\\');
    let zero = |v: u64| v.wrapping_sub(LO) & !v;
    (zero(quote) | zero(slash) | (w.wrapping_sub(splat(0x20)) & !w)) & HI
}

/// Checks that `json` is one JSON object, no deeper than [`MAX_NESTING`], and returns
/// the repository names it holds. The caller has checked that `json` is UTF-8.
pub fn probe(json: &[u8]) -> Result<Names<'_>, ProbeError> {
    Scanner {
        json,
        pos: 0,
        stack: [false; MAX_NESTING],
        depth: 0,
        path: [Key::Other; 3],
        names: Names::default(),
        seen: [false; 5],
    }
    .run()
}

struct Scanner<'a> {
    json: &'a [u8],
    pos: usize,
    /// `true` for an object, `false` for an array, per open level.
    stack: [bool; MAX_NESTING],
    depth: usize,
    /// The key at depth 1, 2 and 3 of the value being scanned (objects only).
    path: [Key; 3],
    names: Names<'a>,
    /// Keys on the repository paths already met, to refuse duplicates: `repository`,
    /// `run`, `run.repository`, `repository.full_name`, `run.repository.full_name`.
    seen: [bool; 5],
}

impl<'a> Scanner<'a> {
    /// The body is not JSON.
    fn err<T>(&self, what: &'static str) -> Result<T, ProbeError> {
        Err(ProbeError {
            what,
            at: self.pos,
            refused: false,
        })
    }

    /// The body may be JSON, but not one the ingest takes (see [`ProbeError::refused`]).
    fn refuse<T>(&self, what: &'static str) -> Result<T, ProbeError> {
        Err(ProbeError {
            what,
            at: self.pos,
            refused: true,
        })
    }

    #[inline(always)]
    fn peek(&self) -> Option<u8> {
        self.json.get(self.pos).copied()
    }

    /// Skips whitespace; runs of spaces (pretty-printed payloads are a third
    /// indentation) eight bytes at a time.
    #[inline(always)]
    fn skip_ws(&mut self) {
        // Plain comparisons, most frequent first: a `match` here became a jump table
        // whose indirect branch was the probe's hottest instruction.
        while let Some(&b) = self.json.get(self.pos) {
            if b > b' ' {
                return;
            }
            if b == b' ' {
                match self.json.get(self.pos..self.pos + 8) {
                    Some(chunk) => {
                        let word = u64::from_le_bytes(chunk.try_into().expect("eight bytes"));
                        let other = word ^ splat(b' ');
                        // Leading spaces of the word (at least one).
                        self.pos += if other == 0 {
                            8
                        } else {
                            (other.trailing_zeros() / 8) as usize
                        };
                    }
                    None => self.pos += 1,
                }
            } else if b == b'\n' || b == b'\r' || b == b'\t' {
                self.pos += 1;
            } else {
                return;
            }
        }
    }

    fn run(mut self) -> Result<Names<'a>, ProbeError> {
        self.skip_ws();
        if self.peek() != Some(b'{') {
            return self.err("expected an object");
        }
        'value: loop {
            self.skip_ws();
            let Some(b) = self.peek() else {
                return self.err("unexpected end, expected a value");
            };
            self.check_type(b)?;
            match b {
                b'{' | b'[' => {
                    let object = b == b'{';
                    if self.depth == MAX_NESTING {
                        return self.refuse("nested too deeply");
                    }
                    self.stack[self.depth] = object;
                    self.depth += 1;
                    self.pos += 1;
                    self.skip_ws();
                    match (object, self.peek()) {
                        (true, Some(b'}')) | (false, Some(b']')) => {
                            self.pos += 1;
                            self.depth -= 1;
                        }
                        (true, _) => {
                            self.key()?;
                            continue 'value;
                        }
                        (false, _) => continue 'value,
                    }
                }
                b'"' => {
                    let start = self.pos;
                    let escaped = self.string()?;
                    self.take_name(start, escaped)?;
                }
                b't' => self.literal(b"true")?,
                b'f' => self.literal(b"false")?,
                b'n' => self.literal(b"null")?,
                b'-' | b'0'..=b'9' => self.number()?,
                _ => return self.err("expected a value"),
            }
            // After a value: a separator, or the end of one or more containers.
            loop {
                self.skip_ws();
                if self.depth == 0 {
                    return if self.pos == self.json.len() {
                        Ok(self.names)
                    } else {
                        self.err("trailing characters")
                    };
                }
                let object = self.stack[self.depth - 1];
                match (object, self.peek()) {
                    (_, Some(b',')) => {
                        self.pos += 1;
                        if object {
                            self.skip_ws();
                            self.key()?;
                        }
                        continue 'value;
                    }
                    (true, Some(b'}')) | (false, Some(b']')) => {
                        self.pos += 1;
                        self.depth -= 1;
                    }
                    (true, _) => return self.err("expected `,` or `}`"),
                    (false, _) => return self.err("expected `,` or `]`"),
                }
            }
        }
    }

    /// The value about to be scanned sits on a repository path: it must have the
    /// type the probe expects (an object or null, a string or null for the names).
    #[inline(always)]
    fn check_type(&self, first: u8) -> Result<(), ProbeError> {
        let Some(target) = self.target() else {
            return Ok(());
        };
        let ok = match target {
            Key::FullName => matches!(first, b'"' | b'n'),
            _ => matches!(first, b'{' | b'n'),
        };
        if ok {
            Ok(())
        } else if target == Key::FullName {
            self.refuse("full_name is not a string")
        } else {
            self.refuse("repository or run is not an object")
        }
    }

    /// Which repository path the value about to be scanned is on, if any: the last
    /// key of the path (`Repository` or `Run` for the containers, `FullName` for a
    /// name).
    #[inline(always)]
    fn target(&self) -> Option<Key> {
        let in_object = self.depth > 0 && self.stack[self.depth - 1];
        if !in_object {
            return None;
        }
        match (self.depth, self.path) {
            (1, [k @ (Key::Repository | Key::Run), ..]) => Some(k),
            (2, [Key::Repository, Key::FullName, _]) => Some(Key::FullName),
            (2, [Key::Run, Key::Repository, _]) => Some(Key::Repository),
            (3, [Key::Run, Key::Repository, Key::FullName]) => Some(Key::FullName),
            _ => None,
        }
    }

    /// A string value just scanned from `start`: keep it when it is a repository name.
    fn take_name(&mut self, start: usize, escaped: bool) -> Result<(), ProbeError> {
        if self.target() != Some(Key::FullName) {
            return Ok(());
        }
        let raw = &self.json[start..self.pos];
        let name = if escaped {
            let decoded: String = serde_json::from_slice(raw).map_err(|_| ProbeError {
                what: "invalid escape in full_name",
                at: start,
                refused: true,
            })?;
            Cow::Owned(decoded)
        } else {
            // UTF-8 was checked over the whole body; the quotes are ASCII.
            match std::str::from_utf8(&raw[1..raw.len() - 1]) {
                Ok(s) => Cow::Borrowed(s),
                Err(_) => return self.err("full_name is not UTF-8"),
            }
        };
        if self.depth == 2 {
            self.names.top = Some(name);
        } else {
            self.names.run = Some(name);
        }
        Ok(())
    }

    /// An object key (the scanner is on its opening quote), then the `:`. Records the
    /// key in the path when it is shallow enough to matter.
    #[inline(always)]
    fn key(&mut self) -> Result<(), ProbeError> {
        if self.peek() != Some(b'"') {
            return self.err("expected a key");
        }
        let start = self.pos;
        let escaped = self.string()?;
        let level = self.depth - 1;
        if level < self.path.len() {
            let raw = &self.json[start + 1..self.pos - 1];
            let key = if escaped {
                // A key that does not decode (a lone surrogate in `\u` escapes) is
                // still JSON, and cannot be one of the names looked for.
                serde_json::from_slice::<String>(&self.json[start..self.pos])
                    .map_or(Key::Other, |k| classify(k.as_bytes()))
            } else {
                classify(raw)
            };
            self.path[level] = key;
            for later in &mut self.path[level + 1..] {
                *later = Key::Other;
            }
            let slot = match (level, self.path) {
                (0, [Key::Repository, ..]) => Some(0),
                (0, [Key::Run, ..]) => Some(1),
                (1, [Key::Run, Key::Repository, _]) => Some(2),
                (1, [Key::Repository, Key::FullName, _]) => Some(3),
                (2, [Key::Run, Key::Repository, Key::FullName]) => Some(4),
                _ => None,
            };
            if let Some(slot) = slot {
                if self.seen[slot] {
                    return self.refuse("duplicate repository field");
                }
                self.seen[slot] = true;
            }
        }
        self.skip_ws();
        if self.peek() != Some(b':') {
            return self.err("expected `:`");
        }
        self.pos += 1;
        Ok(())
    }

    /// A string (the scanner is on its opening quote); leaves the scanner after the
    /// closing quote. Returns whether it held an escape.
    #[inline(always)]
    fn string(&mut self) -> Result<bool, ProbeError> {
        let json = self.json;
        let mut i = self.pos + 1;
        let mut escaped = false;
        loop {
            // Eight bytes at a time while no special byte is among them.
            while let Some(chunk) = json.get(i..i + 8) {
                let word = u64::from_le_bytes(chunk.try_into().expect("eight bytes"));
                let hits = specials(word);
                if hits == 0 {
                    i += 8;
                } else {
                    i += (hits.trailing_zeros() / 8) as usize;
                    break;
                }
            }
            match json.get(i) {
                None => {
                    self.pos = i;
                    return self.err("unterminated string");
                }
                Some(b'"') => {
                    self.pos = i + 1;
                    return Ok(escaped);
                }
                Some(b'\\') => {
                    escaped = true;
                    match json.get(i + 1) {
                        Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => i += 2,
                        Some(b'u') => {
                            let hex = json.get(i + 2..i + 6);
                            if !hex.is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit)) {
                                self.pos = i;
                                return self.err("invalid \\u escape");
                            }
                            i += 6;
                        }
                        _ => {
                            self.pos = i;
                            return self.err("invalid escape");
                        }
                    }
                }
                Some(&b) if b < 0x20 => {
                    self.pos = i;
                    return self.err("control character in a string");
                }
                Some(_) => i += 1,
            }
        }
    }

    #[inline(always)]
    fn literal(&mut self, word: &'static [u8]) -> Result<(), ProbeError> {
        if self.json[self.pos..].starts_with(word) {
            self.pos += word.len();
            Ok(())
        } else {
            self.err("expected a value")
        }
    }

    /// `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`
    #[inline(always)]
    fn number(&mut self) -> Result<(), ProbeError> {
        if self.peek() == Some(b'-') {
            self.pos += 1;
        }
        match self.peek() {
            Some(b'0') => self.pos += 1,
            Some(b'1'..=b'9') => self.digits(),
            _ => return self.err("invalid number"),
        }
        if self.peek() == Some(b'.') {
            self.pos += 1;
            if !matches!(self.peek(), Some(b'0'..=b'9')) {
                return self.err("invalid number");
            }
            self.digits();
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.pos += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.pos += 1;
            }
            if !matches!(self.peek(), Some(b'0'..=b'9')) {
                return self.err("invalid number");
            }
            self.digits();
        }
        Ok(())
    }

    #[inline(always)]
    fn digits(&mut self) {
        while let Some(b'0'..=b'9') = self.peek() {
            self.pos += 1;
        }
    }
}

fn classify(key: &[u8]) -> Key {
    match key {
        b"repository" => Key::Repository,
        b"run" => Key::Run,
        b"full_name" => Key::FullName,
        _ => Key::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(json: &str) -> Names<'_> {
        probe(json.as_bytes()).unwrap_or_else(|e| panic!("{json}: {e}"))
    }

    fn bad(json: &str) -> ProbeError {
        probe(json.as_bytes()).expect_err(json)
    }

    /// Refused as JSON the ingest does not take, not as a syntax error.
    fn refused(json: &str) {
        let e = bad(json);
        assert!(
            e.refused,
            "{json}: {e} should be a refusal, not a syntax error"
        );
    }

    #[test]
    fn finds_both_names_and_only_those() {
        let n = ok(r#"{"repository":{"id":1,"full_name":"o/r"},"x":{"full_name":"no"}}"#);
        assert_eq!(n.top.as_deref(), Some("o/r"));
        assert_eq!(n.run, None);
        let n = ok(r#"{"run":{"repository":{"full_name":"o\/r2"}},"full_name":"no"}"#);
        assert_eq!(n.run.as_deref(), Some("o/r2"));
        assert!(matches!(n.run, Some(Cow::Owned(_))));
        let n = ok(r#"{"a":[{"repository":{"full_name":"deep"}}],"repository":null}"#);
        assert_eq!(n, Names::default());
        // An escaped key is the same key.
        let n = ok(r#"{"repo\u0073itory":{"full\u005fname":"o/e"}}"#);
        assert_eq!(n.top.as_deref(), Some("o/e"));
        // A lone surrogate is valid JSON in a key (found by the json_probe fuzzer).
        assert_eq!(ok(r#"{"a\ud800":1}"#), Names::default());
    }

    #[test]
    fn refuses_what_is_not_json() {
        for json in [
            "",
            "[1]",
            "{",
            "{}x",
            r#"{"a"}"#,
            r#"{"a":}"#,
            r#"{"a":1,}"#,
            r#"{,}"#,
            r#"{"a":[1,]}"#,
            r#"{"a":01}"#,
            r#"{"a":1.}"#,
            r#"{"a":-}"#,
            r#"{"a":1e}"#,
            r#"{"a":tru}"#,
            r#"{"a":"\x"}"#,
            r#"{"a":"\u12G4"}"#,
            "{\"a\":\"\t\"}",
            r#"{"a":"b"#,
            r#"{"a":[}"#,
            r#"{"a":1x}"#,
            r#"{"a":"b"x}"#,
            r#"{"a":[1]x}"#,
            r#"{"a":{]}"#,
            r#"{a:1}"#,
            "{\"a\":1}\u{a0}",
        ] {
            let e = bad(json);
            assert!(!e.refused, "{json}: {e} is a syntax error, not a refusal");
        }
    }

    #[test]
    fn refuses_wrong_types_and_duplicates_on_the_repository_paths() {
        refused(r#"{"repository":"o/r"}"#);
        refused(r#"{"repository":{"full_name":1}}"#);
        refused(r#"{"run":[]}"#);
        refused(r#"{"repository":{"full_name":"o/b"},"repository":{"full_name":"o/a"}}"#);
        refused(r#"{"repository":{},"repository":{}}"#);
        refused(r#"{"repository":{"full_name":"a","full_name":"b"}}"#);
        refused(r#"{"run":{"repository":{}},"run":{}}"#);
        // Valid JSON (a lone surrogate escape), but no name a repository can have.
        refused(r#"{"repository":{"full_name":"o/\ud800"}}"#);
        // Elsewhere, duplicates and odd types are the core's business.
        ok(r#"{"a":1,"a":2,"x":{"repository":1,"repository":2}}"#);
    }

    #[test]
    fn nesting_is_bounded_and_counted_from_the_top_object() {
        let deep = |n: usize| format!("{{\"x\":{}{}}}", "[".repeat(n), "]".repeat(n));
        ok(&deep(MAX_NESTING - 1));
        assert_eq!(bad(&deep(MAX_NESTING)).what, "nested too deeply");
        refused(&deep(MAX_NESTING));
        refused(&deep(100_000));
        // Brackets inside strings are text.
        ok(&format!("{{\"x\":\"\\\"{}\"}}", "[".repeat(1000)));
    }

    #[test]
    fn word_scan_finds_the_first_special_byte_at_every_offset() {
        for at in 0..20 {
            for special in ['"', '\\', '\n', '\u{1}'] {
                let mut s = "a".repeat(at);
                s.push(special);
                s.push_str("bbbbbbbbbbbbbbbbbbbbb\"");
                let json = format!("{{\"k\":\"{s}}}");
                let serde = serde_json::from_str::<serde::de::IgnoredAny>(&json).is_ok();
                assert_eq!(probe(json.as_bytes()).is_ok(), serde, "{json:?}");
            }
        }
        // Multi-byte UTF-8 (high bytes) never counts as special.
        let n = ok("{\"repository\":{\"full_name\":\"ö/ß€😀\"}}");
        assert_eq!(n.top.as_deref(), Some("ö/ß€😀"));
    }

    /// JSON values with the keys on the repository paths among the generated ones.
    fn json_value() -> impl proptest::strategy::Strategy<Value = serde_json::Value> {
        use proptest::prelude::*;
        use serde_json::Value;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            (-1e6f64..1e6).prop_map(Value::from),
            any::<String>().prop_map(Value::String),
            "[a-z/]{0,12}".prop_map(Value::String),
        ];
        let key = prop_oneof![
            Just("repository".to_owned()),
            Just("run".to_owned()),
            Just("full_name".to_owned()),
            any::<String>(),
        ];
        leaf.prop_recursive(5, 48, 6, move |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                proptest::collection::vec((key.clone(), inner), 0..6)
                    .prop_map(|kv| Value::Object(kv.into_iter().collect())),
            ]
        })
    }

    /// Found by `agrees_with_serde_json`: a number beyond f64 passes serde_json's
    /// syntax check but not its `Value`; the oracle must not take one for the other.
    #[test]
    fn a_number_beyond_f64_beside_a_bad_name_is_a_bad_name() {
        let body =
            br#"{"repository":{"full_name":"a","repository":-1000000000000000e308},"run":{}}"#;
        assert!(matches!(
            crate::ingest::delivery::repository_of(body),
            Err(crate::ingest::delivery::DeliveryError::BadRepository(..))
        ));
        crate::fuzzing::json_probe(body);
    }

    /// A byte to put into a JSON text: mostly one that means something to a parser.
    fn json_byte() -> impl proptest::strategy::Strategy<Value = u8> {
        use proptest::prelude::*;
        prop_oneof![
            3 => proptest::sample::select(b"{}[]:,\"\\ \n-+0123456789.eEtrufalsnx\x01\x7f".to_vec()),
            1 => any::<u8>(),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(1024))]

        /// Generated objects, compact and pretty, then with up to three bytes replaced,
        /// inserted or removed: the scanner agrees with serde_json
        /// (`fuzzing::json_probe` holds the oracle).
        #[test]
        fn agrees_with_serde_json(
            fields in proptest::collection::vec(
                (proptest::prelude::prop_oneof![
                    proptest::strategy::Just("repository".to_owned()),
                    proptest::strategy::Just("run".to_owned()),
                    "[a-z_]{1,8}",
                ], json_value()),
                0..6,
            ),
            pretty in proptest::prelude::any::<bool>(),
            edits in proptest::collection::vec(
                (
                    proptest::prelude::any::<usize>(),
                    0u8..3,
                    json_byte(),
                    proptest::prelude::any::<bool>(),
                ),
                0..4,
            ),
        ) {
            let object = serde_json::Value::Object(fields.into_iter().collect());
            let mut bytes = if pretty {
                serde_json::to_vec_pretty(&object).unwrap()
            } else {
                serde_json::to_vec(&object).unwrap()
            };
            crate::fuzzing::json_probe(&bytes);
            for (at, kind, byte, near_structure) in edits {
                // Half the edits land on or right after a structural byte, where a
                // parser's decisions are.
                let structural: Vec<usize> = (0..bytes.len())
                    .filter(|&i| b"{}[],:\"\\".contains(&bytes[i]))
                    .collect();
                let at = if near_structure && !structural.is_empty() {
                    structural[at % structural.len()] + (at / structural.len()) % 2
                } else {
                    at % (bytes.len() + 1)
                };
                match kind {
                    0 if at < bytes.len() => bytes[at] = byte,
                    1 => bytes.insert(at, byte),
                    _ if at < bytes.len() => {
                        bytes.remove(at);
                    }
                    _ => {}
                }
                crate::fuzzing::json_probe(&bytes);
            }
        }
    }
}
