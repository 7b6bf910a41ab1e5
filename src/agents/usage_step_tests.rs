//! The `step_finish` scan against serde: whenever the scan answers, its answer is
//! serde's; on opencode's own lines it answers; on hostile text it answers the same or
//! leaves the event to serde.

use super::{Figures, read};

/// What serde makes of the event at the start of `text` (the meter's fallback): its
/// figures and the bytes it took.
fn by_serde(text: &[u8]) -> Option<(Figures, usize)> {
    let mut stream =
        serde_json::Deserializer::from_slice(text).into_iter::<super::super::StepFinish>();
    let event = stream.next()?.ok()?;
    Some((event.part.figures(), stream.byte_offset()))
}

/// Asserts the scan agrees with serde on `text` (or leaves it to serde); the scan's
/// answer.
fn agree(text: &[u8]) -> Option<(Figures, usize)> {
    let fast = read(text);
    if fast.is_some() {
        assert_eq!(
            fast,
            by_serde(text),
            "the scan differs from serde on {:?}",
            String::from_utf8_lossy(text)
        );
    }
    fast
}

/// A `step_finish` line as opencode-ai 1.18.33 prints it (no newline).
const REAL: &str = r#"{"type":"step_finish","timestamp":978307200000,"sessionID":"ses_1","part":{"id":"prt_1","sessionID":"ses_1","messageID":"msg_1","type":"step-finish","reason":"tool-calls","snapshot":"4b825dc642cb6eb9a060e54bf8d69288fbee4904","cost":0.0045,"tokens":{"total":1330,"input":1000,"output":100,"reasoning":30,"cache":{"read":200,"write":0}}}}"#;

/// The same with another key order (tokens first) and an integer cost.
const REORDERED: &str = r#"{"type":"step_finish","part":{"type":"step-finish","tokens":{"cache":{"write":7,"read":1},"reasoning":0,"output":2,"input":3},"cost":1}}"#;

#[test]
fn opencodes_own_lines_are_scanned_as_serde_reads_them() {
    let want = Figures {
        cost: 0.0045,
        input: 1000.0,
        output: 100.0,
        reasoning: 30.0,
        read: 200.0,
        write: 0.0,
    };
    assert_eq!(agree(REAL.as_bytes()), Some((want, REAL.len())));
    // What follows the event (the line's end, garbage, another event) is not read.
    let more = format!("{REAL}{{\"type\":\"text\"}} \u{1}\\");
    assert_eq!(agree(more.as_bytes()), Some((want, REAL.len())));
    let (f, used) = agree(REORDERED.as_bytes()).expect("the plain shape");
    assert_eq!(used, REORDERED.len());
    assert_eq!((f.cost, f.input, f.output), (1.0, 3.0, 2.0));
    assert_eq!((f.reasoning, f.read, f.write), (0.0, 1.0, 7.0));
    // Missing figures are 0, as serde's defaults.
    let bare = br#"{"type":"step_finish","part":{}}"#;
    assert_eq!(agree(bare), Some((Figures::default(), bare.len())));
}

#[test]
fn every_cut_of_a_real_line_is_no_event() {
    for end in 0..REAL.len() {
        let cut = &REAL.as_bytes()[..end];
        assert_eq!(read(cut), None, "{end}");
        assert_eq!(by_serde(cut), None, "{end}");
    }
}

#[test]
fn numbers_are_read_as_serde_reads_them() {
    for n in [
        "0",
        "-0",
        "7",
        "-5",
        "123456789012345",
        "1234567890123456",
        "99999999999999999999999",
        "18446744073709551616",
        "0.5",
        "2.5",
        "1e3",
        "1E+3",
        "-1e308",
        "1.7976931348623157e308",
        "1e-400",
        "4.9e-324",
    ] {
        for field in ["cost", "input"] {
            let line = REAL.replacen(
                &format!("\"{field}\":"),
                &format!("\"{field}\":{n},\"x\":"),
                1,
            );
            assert!(agree(line.as_bytes()).is_some(), "{line}");
        }
    }
    // Out of range or not JSON numbers: serde refuses the event, and so does the scan.
    for n in [
        "1e400", "-1e400", "01", "-", "1.", ".5", "+1", "1e", "1e+", "0x10", "NaN", "Infinity",
        "--1", "1.2.3",
    ] {
        let line = REAL.replacen("\"input\":1000", &format!("\"input\":{n}"), 1);
        assert_eq!(read(line.as_bytes()), None, "{line}");
        assert_eq!(by_serde(line.as_bytes()), None, "{line}");
    }
}

#[test]
fn hostile_shapes_agree_with_serde_or_are_left_to_it() {
    let cases: &[&str] = &[
        // Wrong types where a figure or an object is expected.
        r#"{"type":"step_finish","part":{"cost":"1","tokens":{"input":5}}}"#,
        r#"{"type":"step_finish","part":{"cost":null}}"#,
        r#"{"type":"step_finish","part":{"cost":true}}"#,
        r#"{"type":"step_finish","part":{"cost":[1]}}"#,
        r#"{"type":"step_finish","part":{"tokens":null}}"#,
        r#"{"type":"step_finish","part":{"tokens":{"cache":[]}}}"#,
        r#"{"type":"step_finish","part":[0.5,{"input":9}]}"#,
        r#"{"type":"step_finish","part":null}"#,
        r#"{"type":"step_finish","part":"x"}"#,
        r#"{"type":"step_finish"}"#,
        r#"{"type":"step_finish","part":{"cost":1},"part":{"cost":2}}"#,
        r#"{"type":"step_finish","part":{"cost":1,"cost":2}}"#,
        r#"{"type":"step_finish","part":{"tokens":{"input":1,"input":2}}}"#,
        r#"{"type":"step_finish","part":{"tokens":{"cache":{"read":1,"read":1}}}}"#,
        // Strings that look like a type field or a figure, escaped or nested.
        r#"{"type":"step_finish","part":{"reason":"\"cost\":9,\"tokens\":{\"input\":9}","cost":0.1}}"#,
        r#"{"type":"step_finish","part":{"reason":"{\"type\":\"step_finish\",\"part\":{\"cost\":9}}","cost":0.1}}"#,
        r#"{"type":"step_finish","part":{"id":"\",\"cost\":7,\"","cost":0.1}}"#,
        r#"{"type":"step_finish","part":{"c\u006fst":5,"tokens":{"inp\u0075t":6}}}"#,
        r#"{"type":"step_finish","p\u0061rt":{"cost":5}}"#,
        r#"{"type":"step_finish","part":{"x":{"cost":5,"tokens":{"input":7}},"cost":0.25}}"#,
        r#"{"type":"step_finish","part":{"x":["cost",5,{"cost":6}],"tokens":{"y":{"input":7},"input":8}}}"#,
        r#"{"type":"step_finish","part":{"cost":1},"x":{"type":"step_finish","part":{"cost":9}}}"#,
        r#"{"type":"step_finish","part":{"reason":"caf\u00e9","cost":1}}"#,
        "{\"type\":\"step_finish\",\"part\":{\"reason\":\"caf\u{e9}\",\"cost\":1}}",
        "{\"type\":\"step_finish\",\"part\":{\"reason\":\"a\tb\",\"cost\":1}}",
        "{\"type\":\"step_finish\",\"part\":{\"reason\":\"a\u{7f}b\",\"cost\":1}}",
        r#"{"type":"step_finish","part":{"reason":"\ud800","cost":1}}"#,
        r#"{"type":"step_finish","part":{"reason":"\x","cost":1}}"#,
        // Whitespace, which opencode never writes and JSON allows.
        r#"{"type":"step_finish", "part": { "cost" : 1 , "tokens":{"input": 2} } }"#,
        "{\"type\":\"step_finish\",\"part\":{\"cost\":1}\n}",
        // Broken syntax.
        r#"{"type":"step_finish","part":{"cost":1,}}"#,
        r#"{"type":"step_finish","part":{"cost" 1}}"#,
        r#"{"type":"step_finish","part":{"cost":1}"#,
        r#"{"type":"step_finish","part":{"cost":1}]"#,
        r#"{"type":"step_finish","part":{"x":[1,]}}"#,
        r#"{"type":"step_finish","part":{"x":tru}}"#,
        r#"{"type":"step_finish","part":{"x":nul,"cost":1}}"#,
        r#"{"type":"step_finish","part":{"x":{"a"}}}"#,
        r#"{"type":"step_finish","part":{"x":1e5,"cost":1}}"#,
        r#"{"type":"step_finish","part":{"x":[true,false,null,-1.5,"s",{},[]],"cost":1}}"#,
        r#"{"type":"step_finishXYZ","part":{"cost":1}}"#,
    ];
    for case in cases {
        agree(case.as_bytes());
    }
    // The nested and quoted look-alikes count only the real figures.
    let nested = cases[19].as_bytes();
    assert_eq!(
        read(nested).map(|(f, _)| (f.cost, f.input)),
        Some((0.25, 0.0))
    );
    let inner = cases[21].as_bytes();
    assert_eq!(
        read(inner).map(|(f, u)| (f.cost, u)),
        Some((1.0, inner.len()))
    );
    // Escapes, whitespace and non-ASCII text are left to serde.
    for i in [14, 15, 16, 17, 18, 22, 23, 24, 25, 26, 27, 28, 29] {
        assert_eq!(read(cases[i].as_bytes()), None, "{}", cases[i]);
    }
    // Duplicates and wrong types: serde refuses the event; the scan does not count it.
    for i in [0, 1, 2, 3, 4, 7, 8, 9, 10, 11, 12, 13] {
        assert_eq!(read(cases[i].as_bytes()), None, "{}", cases[i]);
        assert_eq!(by_serde(cases[i].as_bytes()), None, "{}", cases[i]);
    }
}

#[test]
fn deep_nesting_is_left_to_serde() {
    for depth in [10, 60, 70, 127, 200, 5000] {
        let line = format!(
            r#"{{"type":"step_finish","part":{{"x":{}1{},"cost":1}}}}"#,
            "[".repeat(depth),
            "]".repeat(depth)
        );
        let fast = agree(line.as_bytes());
        assert_eq!(fast.is_some(), depth <= 60, "{depth}");
        let line = format!(
            r#"{{"type":"step_finish","part":{{"x":{}1{},"cost":1}}}}"#,
            r#"{"a":"#.repeat(depth),
            "}".repeat(depth)
        );
        agree(line.as_bytes());
    }
}

#[test]
fn mutated_lines_agree_with_serde() {
    let alphabet = b"{}[]\":,\\ \t0123456789.eE+-atrufsnlx\x00\x1f\x7f\xc3\xa9\xff";
    let (mut scanned, mut by_serde_only) = (0, 0);
    super::super::scan::mutations(&[REAL, REORDERED], 20_000, alphabet, |line| {
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
