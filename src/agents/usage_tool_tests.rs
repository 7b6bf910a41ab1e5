//! The `tool_use` scan against `tool_call::read` (serde): whenever the scan answers,
//! its answer is serde's; on opencode's own lines it answers; on hostile text it
//! answers the same or leaves the event to serde.

use super::super::tool_call;
use super::read;

/// What serde makes of the call at the start of `text` (the meter's fallback): the
/// tool's name and the input's raw text, each when known.
fn by_serde(text: &[u8]) -> Option<(Option<String>, Option<String>)> {
    tool_call::read(text).map(|c| {
        (
            c.tool.map(|t| t.into_owned()),
            c.input.map(|r| r.get().to_owned()),
        )
    })
}

/// Asserts the scan agrees with serde on `text` (or leaves it to serde); the scan's
/// answer.
fn agree(text: &[u8]) -> Option<(String, String)> {
    let fast = read(text).map(|(t, i)| (t.to_owned(), i.to_owned()));
    if let Some((tool, input)) = &fast {
        assert_eq!(
            Some((Some(tool.clone()), Some(input.clone()))),
            by_serde(text),
            "the scan differs from serde on {:?}",
            String::from_utf8_lossy(text)
        );
    }
    fast
}

/// A `tool_use` line as opencode-ai 1.18.33 prints it (no newline), its output long.
fn real(input: &str, output: &str) -> String {
    format!(
        r#"{{"type":"tool_use","timestamp":978307200000,"sessionID":"ses_1","part":{{"id":"prt_2","sessionID":"ses_1","messageID":"msg_1","type":"tool","callID":"call_1","tool":"bash","state":{{"status":"completed","input":{input},"output":"{output}","title":"ls","metadata":{{"output":"{output}","exit":0,"description":"Lists files"}},"time":{{"start":978307200000,"end":978307200100}}}}}}}}"#
    )
}

/// The bench's line (`tests/it/agents/bench.rs`).
const BENCH: &str = r#"{"type":"tool_use","timestamp":7,"sessionID":"ses_b","part":{"id":"prt_7b","type":"tool","tool":"bash","callID":"call_7","state":{"status":"completed","input":{"command":"ls 7"},"output":"xxxxxxxx","title":"ls","metadata":{},"time":{"start":1,"end":2}}}}"#;

/// State before tool (serde_json's sorted keys, as the meter's own tests write it).
const SORTED: &str = r#"{"type":"tool_use","timestamp":2,"sessionID":"ses_1","part":{"callID":"call_1","id":"prt_2","state":{"input":{"command":"ls"},"metadata":{},"output":"ok","status":"completed","time":{"end":2,"start":1},"title":"t"},"tool":"bash","type":"tool"}}"#;

fn pair(tool: &str, input: &str) -> Option<(String, String)> {
    Some((tool.to_owned(), input.to_owned()))
}

#[test]
fn opencodes_own_lines_are_scanned_as_serde_reads_them() {
    let line = real(
        r#"{"command":"ls -la /tmp","description":"Lists files"}"#,
        "total 0",
    );
    assert_eq!(
        agree(line.as_bytes()),
        pair(
            "bash",
            r#"{"command":"ls -la /tmp","description":"Lists files"}"#
        )
    );
    assert_eq!(
        agree(BENCH.as_bytes()),
        pair("bash", r#"{"command":"ls 7"}"#)
    );
    assert_eq!(
        agree(SORTED.as_bytes()),
        pair("bash", r#"{"command":"ls"}"#)
    );
    // The model's arguments: escapes, UTF-8, braces and quotes in strings, nesting.
    for input in [
        r#"{"filePath":"/w/a.rs","oldString":"fn a() {\n\t\"x\"\n}","newString":"fn a() {}\\"}"#,
        r#"{"content":"h\u00e9 \ud83d\ude00 \/ \b\f\r","x":"é – 日本"}"#,
        r#"{"todos":[{"id":"1","content":"{\"type\":\"tool_use\"}","status":"pending","priority":1.5}],"n":-0.25,"t":true,"f":false,"z":null}"#,
        r#"{}"#,
        r#"[]"#,
        r#""ls""#,
        r#"12345678901234567890123456789"#,
        r#"null"#,
        r#"{"a":{"b":{"c":[[],[{}],"}"]}}}"#,
    ] {
        let line = real(input, "out");
        assert_eq!(agree(line.as_bytes()), pair("bash", input), "{input}");
    }
}

#[test]
fn the_output_is_never_read() {
    // Cut inside the output, or the output broken: the call is known before it.
    let line = real(r#"{"command":"ls"}"#, "x\u{1}\\q");
    assert_eq!(agree(line.as_bytes()), pair("bash", r#"{"command":"ls"}"#));
    let cut = &BENCH[..BENCH.find("xxxx").unwrap() + 2];
    assert_eq!(agree(cut.as_bytes()), pair("bash", r#"{"command":"ls 7"}"#));
}

#[test]
fn every_cut_of_a_real_line_agrees_with_serde() {
    let tool_first = real(r#"{"command":"a\"b","n":[1,{"x":null}]}"#, "o");
    let tool_last = SORTED.to_owned();
    // Where the call is known: the end of the input, or of the name.
    let known = [
        tool_first.find(r#","output""#).unwrap(),
        tool_last.find(r#""tool":"bash""#).unwrap() + r#""tool":"bash""#.len(),
    ];
    for (line, known) in [tool_first, tool_last].iter().zip(known) {
        for cut in 0..=line.len() {
            let fast = agree(&line.as_bytes()[..cut]);
            assert_eq!(fast.is_some(), cut >= known, "{cut}");
        }
    }
}

#[test]
fn hostile_shapes_agree_with_serde_or_are_left_to_it() {
    let scanned = [
        // A `"tool"` inside a string, and keys named like ours at other levels.
        r#"{"type":"tool_use","part":{"tool":"bash","state":{"input":{"tool":"rm","x":"\"tool\":\"rm\"","input":1}}}}"#,
        r#"{"type":"tool_use","tool":"rm","state":{"input":2},"part":{"tool":"bash","x":{"tool":"rm"},"state":{"input":3}}}"#,
        r#"{"type":"tool_use","part":{"tool":"","state":{"input":""}}}"#,
        r#"{"type":"tool_use","part":{"tool":"bash","state":{"input":"}"}}}"#,
        r#"{"type":"tool_use","part":{"tool":"bash","state":{"input":-0}},"part":5}"#,
        // Cut after the call: it is known.
        r#"{"type":"tool_use","part":{"tool":"bash","state":{"input":1}"#,
    ];
    for line in scanned {
        assert!(agree(line.as_bytes()).is_some(), "{line}");
    }
    let left = [
        // Escapes outside the input: serde reads them, the scan does not.
        r#"{"type":"tool_use","x":"\"tool\":\"rm\"","part":{"tool":"bash","state":{"input":1}}}"#,
        r#"{"type":"tool_use","p\u0061rt":{"tool":"bash","state":{"input":1}}}"#,
        r#"{"type":"tool_use","part":{"t\u006fol":"bash","state":{"input":1}}}"#,
        r#"{"type":"tool_use","part":{"tool":"b\u0061sh","state":{"input":1}}}"#,
        r#"{"type":"tool_use","part":{"tool":"bash","state":{"inp\u0075t":1}}}"#,
        r#"{"type":"tool_use","part":{"tool":"bash","st\u0061te":{"input":1}}}"#,
        r#"{"type":"tool_use","part":{"tool":"ba\"sh","state":{"input":1}}}"#,
        r#"{"type":"tool_use","part":{"tool":"bäsh","state":{"input":1}}}"#,
        // Duplicate keys: serde takes the last, the scan none.
        r#"{"type":"tool_use","part":{"tool":"rm","tool":"bash","state":{"input":1}}}"#,
        r#"{"type":"tool_use","part":{"state":{"input":1,"input":2},"tool":"bash"}}"#,
        r#"{"type":"tool_use","part":{"state":{"x":1},"state":{"input":2},"tool":"bash"}}"#,
        r#"{"type":"tool_use","part":{"state":{}},"part":{"tool":"bash","state":{"input":2}}}"#,
        // Whitespace, wrong types, control bytes, broken escapes, exponents.
        r#"{"type":"tool_use", "part":{"tool":"bash","state":{"input":1}}}"#,
        r#"{"type":"tool_use","part":{"tool":"bash","state":{"input": 1}}}"#,
        r#"{"type":"tool_use","part":{"tool":"bash","state":{"input":{"a" :1}}}}"#,
        r#"{"type":"tool_use","part":{"tool":7,"state":{"input":1}}}"#,
        r#"{"type":"tool_use","part":{"tool":null,"state":{"input":1}}}"#,
        r#"{"type":"tool_use","part":{"tool":"bash","state":[1]}}"#,
        r#"{"type":"tool_use","part":["tool","bash"]}"#,
        "{\"type\":\"tool_use\",\"part\":{\"tool\":\"bash\",\"state\":{\"input\":\"a\tb\"}}}",
        r#"{"type":"tool_use","part":{"tool":"bash","state":{"input":"\x"}}}"#,
        r#"{"type":"tool_use","part":{"tool":"bash","state":{"input":"\u12G4"}}}"#,
        r#"{"type":"tool_use","part":{"tool":"bash","state":{"input":1e5}}}"#,
        r#"{"type":"tool_use","part":{"tool":"bash","state":{"input":01}}}"#,
        r#"{"type":"tool_use","part":{"tool":"bash","state":{"input":-00,"x":1}}}"#,
        r#"{"type":"tool_use","part":{"tool":"bash","state":{"input":0.5e}}"#,
        r#"{"type":"tool_use","part":{"tool":"bash","state":{"input":[1,]}}}"#,
        r#"{"type":"tool_use","part":{"tool":"bash","state":{"input":{"a":1,}}}}"#,
        r#"{"type":"tool_use","part":{"tool":"bash","state":{"input":tru}}}"#,
        r#"{"type":"tool_use","x":1e3,"part":{"tool":"bash","state":{"input":1}}}"#,
        // Missing parts: serde answers a call with an unknown half, the scan none.
        r#"{"type":"tool_use","part":{"tool":"bash"}}"#,
        r#"{"type":"tool_use","part":{"state":{"input":{}}}}"#,
        r#"{"type":"tool_use","part":{}}"#,
        r#"{"type":"tool_use"}"#,
    ];
    for line in left {
        assert_eq!(agree(line.as_bytes()), None, "{line}");
    }
    // Bytes that are not UTF-8 in the input: serde refuses them, so does the scan.
    let mut line = br#"{"type":"tool_use","part":{"tool":"bash","state":{"input":"a"#.to_vec();
    line.extend_from_slice(b"\xff\"}}}");
    assert_eq!(agree(&line), None);
    assert_eq!(by_serde(&line), None);
}

#[test]
fn deep_nesting_is_left_to_serde() {
    for depth in [10, 60, 61, 62, 70, 127, 200, 5000] {
        for (open, close) in [("[", "]"), (r#"{"a":"#, "}")] {
            let line = format!(
                r#"{{"type":"tool_use","part":{{"tool":"bash","state":{{"input":{}1{}}}}}}}"#,
                open.repeat(depth),
                close.repeat(depth)
            );
            let fast = agree(line.as_bytes());
            assert_eq!(fast.is_some(), depth <= 61, "{depth}");
            let line = format!(
                r#"{{"type":"tool_use","x":{}1{},"part":{{"tool":"bash","state":{{"input":1}}}}}}"#,
                open.repeat(depth),
                close.repeat(depth)
            );
            agree(line.as_bytes());
        }
    }
}

#[test]
fn mutated_lines_agree_with_serde() {
    let alphabet = b"{}[]\":,\\/ \t0123456789.eE+-atrufsnlxbu\x00\x1f\x7f\xc3\xa9\xff";
    let rich = real(
        r#"{"command":"echo \"{\\n}\" \u00e9","n":[1,-2.5,{"k":null}],"b":true}"#,
        "out",
    );
    let (mut scanned, mut by_serde_only) = (0, 0);
    super::super::scan::mutations(&[BENCH, SORTED, rich.as_str()], 15_000, alphabet, |line| {
        if agree(line).is_some() {
            scanned += 1;
        } else if by_serde(line).is_some() {
            by_serde_only += 1;
        }
    });
    // Both paths are exercised (the figures only show the walk reaches both).
    assert!(scanned > 1000, "{scanned}");
    assert!(by_serde_only > 100, "{by_serde_only}");
}
