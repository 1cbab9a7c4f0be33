//! Canonical JSON (v1's serialization rule) and the reconstruction of JSON values from the
//! rendered text the protocol carries.
//!
//! Canonical JSON here is byte for byte what Python writes with
//! `json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"))`: compact, object
//! keys sorted recursively by code point, non-ASCII characters kept, and Python's escapes (`\"`,
//! `\\`, `\n`, `\r`, `\t`, `\b`, `\f`, every other control character as `\u00xx` in lower-case
//! hex; `/`, DEL and U+2028/U+2029 as they are). Floats use Python's `repr`, the same digits the
//! host's `render_value` wrote.

use hunch_core::text::python_float_repr;
use serde_json::Value;
use std::fmt::Write;

/// The value a rendered text stands for. A text that parses as a JSON object or array is that
/// structure (the host's `render_value` writes structured states, instructions and descriptions
/// as JSON text); anything else is a string, verbatim.
///
/// This is ambiguous by construction: a caller's *string* whose text is itself a JSON object or
/// array reads as the structure, because the protocol carries only the text.
pub fn reconstruct(text: &str) -> Value {
    match structured(text) {
        Some(value) => value,
        None => Value::String(text.to_string()),
    }
}

/// The structure a text parses as, when it is a JSON object or array.
pub fn structured(text: &str) -> Option<Value> {
    // Only objects and arrays count: a state `"42"` or `"true"` stays the string it was.
    let first = text.trim_start().chars().next()?;
    if first != '{' && first != '[' {
        return None;
    }
    match serde_json::from_str::<Value>(text) {
        Ok(value @ (Value::Object(_) | Value::Array(_))) => Some(value),
        _ => None,
    }
}

/// v1's instruction-text rule applied to a rendered text: structured text as canonical JSON, any
/// other text verbatim (not quoted).
pub fn instruction_text(text: &str) -> String {
    match structured(text) {
        Some(value) => canonical(&value),
        None => text.to_string(),
    }
}

/// Canonical JSON of `value`.
pub fn canonical(value: &Value) -> String {
    let mut out = String::new();
    write_value(&mut out, value);
    out
}

fn write_value(out: &mut String, value: &Value) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => write_number(out, n),
        Value::String(s) => write_string(out, s),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(out, item);
            }
            out.push(']');
        }
        Value::Object(map) => {
            // Rust orders `str` by UTF-8 bytes, which is code-point order: Python's `sort_keys`.
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(out, key);
                out.push(':');
                write_value(out, item);
            }
            out.push('}');
        }
    }
}

fn write_number(out: &mut String, n: &serde_json::Number) {
    if n.is_i64() || n.is_u64() {
        let _ = write!(out, "{n}");
        return;
    }
    match n.as_f64() {
        // serde_json never yields a non-finite number, so v1's "non-finite is invalid" cannot
        // arise here.
        Some(f) => out.push_str(&python_float_repr(f)),
        None => {
            let _ = write!(out, "{n}");
        }
    }
}

/// A JSON string as Python's encoder (with `ensure_ascii=False`) writes it.
pub fn write_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    // Every expected string below was produced by
    // python3 -c 'import json; print(json.dumps(V, ensure_ascii=False, sort_keys=True,
    // separators=(",",":")))'.

    #[test]
    fn keys_are_sorted_recursively_and_arrays_keep_their_order() {
        let v = json!({"b": [3, {"z": 1, "a": null}], "a": {"y": true, "x": false}});
        assert_eq!(
            canonical(&v),
            r#"{"a":{"x":false,"y":true},"b":[3,{"a":null,"z":1}]}"#
        );
    }

    #[test]
    fn keys_sort_by_code_point() {
        // Upper case before lower case, digits before letters, non-ASCII (é, 日, 😀) last.
        let v: Value =
            serde_json::from_str(r#"{"é":1,"b":2,"B":3,"10":4,"9":5,"日":6,"😀":7,"":8}"#).unwrap();
        assert_eq!(
            canonical(&v),
            r#"{"":8,"10":4,"9":5,"B":3,"b":2,"é":1,"日":6,"😀":7}"#
        );
    }

    #[test]
    fn strings_escape_as_python_does() {
        let v = Value::String(
            "quote\" back\\ slash/ nl\n cr\r tab\t bs\u{08} ff\u{0c} nul\u{0} us\u{1f} del\u{7f} \
             ls\u{2028} é 日本 😀"
                .into(),
        );
        assert_eq!(
            canonical(&v),
            "\"quote\\\" back\\\\ slash/ nl\\n cr\\r tab\\t bs\\b ff\\f nul\\u0000 us\\u001f \
             del\u{7f} ls\u{2028} é 日本 😀\""
        );
    }

    #[test]
    fn numbers_follow_python() {
        // `-0` is not here: serde_json reads it as the float -0.0 (Python: the int 0), and the
        // text the host renders never holds it (its `render_value` writes floats as `-0.0`).
        let v: Value = serde_json::from_str(
            r#"[1, -0.0, 1.0, 1.5, 1e16, 1.5e-5, 0.0001, -2.25, 123456789012]"#,
        )
        .unwrap();
        assert_eq!(
            canonical(&v),
            "[1,-0.0,1.0,1.5,1e+16,1.5e-05,0.0001,-2.25,123456789012]"
        );
    }

    #[test]
    fn structured_text_is_reconstructed_and_other_text_is_a_string() {
        // What the host's render_value writes for an object state (Python separators).
        let rendered = r#"{"name": "Ann", "age": 3, "tags": ["a", "b"]}"#;
        assert_eq!(
            canonical(&reconstruct(rendered)),
            r#"{"age":3,"name":"Ann","tags":["a","b"]}"#
        );
        assert_eq!(canonical(&reconstruct("[1, 2]")), "[1,2]");
        assert_eq!(canonical(&reconstruct("[]")), "[]");
        assert_eq!(canonical(&reconstruct("{}")), "{}");
        // Scalars and broken JSON stay strings.
        for text in [
            "42",
            "true",
            "null",
            "\"q\"",
            "{not json",
            "[1,",
            "",
            "The bicycle is red.",
        ] {
            assert_eq!(reconstruct(text), Value::String(text.into()), "{text}");
        }
        assert_eq!(canonical(&reconstruct("")), "\"\"");
    }

    #[test]
    fn instruction_text_is_verbatim_unless_structured() {
        assert_eq!(instruction_text("Color?"), "Color?");
        assert_eq!(instruction_text(r#"{"b": 2, "a": 1}"#), r#"{"a":1,"b":2}"#);
        assert_eq!(instruction_text(""), "");
        assert_eq!(instruction_text("say \"hi\"\n"), "say \"hi\"\n");
    }
}
