//! A field-level diff of two JSON documents: the paths whose values differ, with both
//! values. Objects are compared key by key (recursively); arrays and scalars as whole
//! values, which keeps the output short for the lists a record holds.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One differing field.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Change {
    /// JSON path, e.g. `work.tier` or `ci.<sha>.contexts`.
    pub path: String,
    /// Value on the left (`null` when absent).
    pub left: Value,
    /// Value on the right (`null` when absent).
    pub right: Value,
}

/// Every differing field between `left` and `right`, in key order.
pub fn diff(left: &Value, right: &Value) -> Vec<Change> {
    let mut out = Vec::new();
    walk("", left, right, &mut out);
    out
}

fn walk(path: &str, left: &Value, right: &Value, out: &mut Vec<Change>) {
    match (left, right) {
        (Value::Object(l), Value::Object(r)) => {
            let mut keys: Vec<&String> = l.keys().chain(r.keys()).collect();
            keys.sort();
            keys.dedup();
            for k in keys {
                let sub = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                let lv = l.get(k).unwrap_or(&Value::Null);
                let rv = r.get(k).unwrap_or(&Value::Null);
                walk(&sub, lv, rv, out);
            }
        }
        (l, r) if l == r => {}
        (l, r) => out.push(Change {
            path: if path.is_empty() {
                ".".into()
            } else {
                path.into()
            },
            left: l.clone(),
            right: r.clone(),
        }),
    }
}

/// The changes as text, one `path: left → right` line each (values compact JSON,
/// long ones cut).
pub fn render(changes: &[Change]) -> String {
    changes
        .iter()
        .map(|c| format!("  {}: {} → {}\n", c.path, short(&c.left), short(&c.right)))
        .collect()
}

/// Compact JSON, at most 160 characters.
fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() <= 160 {
        return s;
    }
    let cut: String = s.chars().take(157).collect();
    format!("{cut}...")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn finds_nested_changes_only() {
        let a = json!({"v": 1, "work": {"tier": 0, "attempts": []}, "x": "same"});
        let b = json!({"v": 1, "work": {"tier": 2, "attempts": [1]}, "x": "same", "new": true});
        let d = diff(&a, &b);
        let paths: Vec<&str> = d.iter().map(|c| c.path.as_str()).collect();
        assert_eq!(paths, ["new", "work.attempts", "work.tier"]);
        assert_eq!(d[2].left, json!(0));
        assert_eq!(d[2].right, json!(2));
        assert!(diff(&a, &a).is_empty());
        assert_eq!(diff(&json!(1), &json!(2))[0].path, ".");
        assert!(render(&d).contains("work.tier: 0 → 2"));
    }
}
