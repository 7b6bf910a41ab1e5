//! The call a `tool_use` event announces — the tool's name and its arguments — read
//! from the line without copying and **without reading past them**: opencode writes a
//! tool part as `{"id",…,"tool":NAME,"state":{"status","input":{…},"output":"…",…}}`
//! (`JSON.stringify`, keys in that order), so the tool's output, often kilobytes, comes
//! after what the meter needs. The reader stops as soon as both are known; the meter
//! then goes on scanning the line for further events (a JSON string cannot hold the
//! bytes `{"type":"` unescaped, so the output hides none and forges none).

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, Visitor};
use serde_json::value::RawValue;

/// What a `tool_use` line says of its call.
#[derive(Debug, Default)]
pub(super) struct Call<'a> {
    /// The tool's name (`part.tool`), when given.
    pub tool: Option<Cow<'a, str>>,
    /// The call's arguments (`part.state.input`) as their JSON text, when given.
    pub input: Option<&'a RawValue>,
    /// Both are known: reading stopped there.
    done: bool,
}

impl Call<'_> {
    /// Whether both parts of the call are known.
    fn complete(&self) -> bool {
        self.tool.is_some() && self.input.is_some()
    }
}

/// The error that ends the reading once the call is known (never reported).
const KNOWN: &str = "the call is known";

/// Reads the call of the `tool_use` event at the start of `text`: `None` when the text
/// is not an object with a `part` object before its JSON ends or breaks. A part
/// without `tool` or `state.input` is a call with those unknown.
pub(super) fn read(text: &[u8]) -> Option<Call<'_>> {
    let mut call = Call::default();
    let mut de = serde_json::Deserializer::from_slice(text);
    let mut part = false;
    match (Reader {
        level: Level::Event(&mut part),
        call: &mut call,
    })
    .deserialize(&mut de)
    {
        Ok(()) if part => Some(call),
        Ok(()) => None,
        Err(_) if call.done => Some(call),
        Err(_) => None,
    }
}

/// Which object is being read.
enum Level<'p> {
    /// The event: `part` is read, the rest skipped; the flag says a part was seen.
    Event(&'p mut bool),
    /// The tool part: `tool` and `state`.
    Part,
    /// The part's state: `input`.
    State,
}

/// A key, compared with a name without allocating (escaped keys are compared too).
struct KeyIs(&'static [&'static str]);

impl<'de> DeserializeSeed<'de> for KeyIs {
    type Value = Option<usize>;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl Visitor<'_> for KeyIs {
    type Value = Option<usize>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a key")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(self.0.iter().position(|name| *name == v))
    }
}

/// A string borrowed from the line when it has no escapes, else unescaped.
struct Text;

impl<'de> DeserializeSeed<'de> for Text {
    type Value = Cow<'de, str>;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Text {
    type Value = Cow<'de, str>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }
    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Cow::Borrowed(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Cow::Owned(v.to_owned()))
    }
}

/// Reads one object of the event into the call.
struct Reader<'p, 'c, 'de> {
    /// Which object it is.
    level: Level<'p>,
    /// What is known so far.
    call: &'c mut Call<'de>,
}

impl<'de> DeserializeSeed<'de> for Reader<'_, '_, 'de> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Reader<'_, '_, 'de> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let Reader { mut level, call } = self;
        let names: &'static [&'static str] = match level {
            Level::Event(_) => &["part"],
            Level::Part => &["tool", "state"],
            Level::State => &["input"],
        };
        while let Some(key) = map.next_key_seed(KeyIs(names))? {
            match (&mut level, key) {
                (Level::Event(seen), Some(_)) => {
                    **seen = true;
                    map.next_value_seed(Reader {
                        level: Level::Part,
                        call: &mut *call,
                    })?;
                }
                (Level::Part, Some(0)) => call.tool = Some(map.next_value_seed(Text)?),
                (Level::Part, Some(_)) => map.next_value_seed(Reader {
                    level: Level::State,
                    call: &mut *call,
                })?,
                (Level::State, Some(_)) => {
                    call.input = Some(map.next_value::<&'de RawValue>()?);
                }
                (_, None) => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            if call.complete() {
                call.done = true;
                return Err(de::Error::custom(KNOWN));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::read;

    fn call(line: &str) -> Option<(String, String)> {
        read(line.as_bytes()).map(|c| {
            (
                c.tool.map(|t| t.into_owned()).unwrap_or_default(),
                c.input.map_or("null".to_owned(), |r| r.get().to_owned()),
            )
        })
    }

    #[test]
    fn the_call_is_read_and_the_output_never_is() {
        // The output is cut (no closing quote): reading stopped before it.
        let line = r#"{"type":"tool_use","part":{"id":"p","type":"tool","tool":"bash","state":{"status":"completed","input":{"command":"ls"},"output":"xxxxxxxx"#;
        assert_eq!(
            call(line),
            Some(("bash".into(), r#"{"command":"ls"}"#.into()))
        );
    }

    #[test]
    fn escaped_names_and_keys_are_read_as_json_says() {
        let line = r#"{"type":"tool_use","p\u0061rt":{"tool":"b\u0061sh","state":{"input":[1]}}}"#;
        assert_eq!(call(line), Some(("bash".into(), "[1]".into())));
    }

    #[test]
    fn missing_parts_are_unknown_and_garbage_is_no_call() {
        assert_eq!(
            call(r#"{"type":"tool_use","part":{"tool":"bash"}}"#),
            Some(("bash".into(), "null".into()))
        );
        assert_eq!(
            call(r#"{"type":"tool_use","part":{"state":{"input":{}}}}"#),
            Some((String::new(), "{}".into()))
        );
        assert_eq!(call(r#"{"type":"tool_use"}"#), None);
        assert_eq!(call(r#"{"type":"tool_use","part":7}"#), None);
        assert_eq!(call(r#"{"type":"tool_use","part":{"tool":5,"state""#), None);
        assert_eq!(call(r#"{"type":"tool_use","part":{"tool":"ba"#), None);
    }
}
