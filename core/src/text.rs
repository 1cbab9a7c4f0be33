//! Rendering JSON values into prompt text exactly as the Python reference does
//! (`json.dumps(value, ensure_ascii=False)`: `", "` and `": "` separators, non-ASCII kept, floats
//! in Python's `repr`), so a prompt built here is byte-identical to the reference's.

use serde_json::Value;
use std::fmt::Write;

/// A `state`, `instructions` or description as prompt text: strings as they are, `null` as
/// nothing, everything else as Python-compatible JSON.
pub fn render_value(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => python_json(other),
    }
}

/// `json.dumps(value, ensure_ascii=False)`.
pub fn python_json(value: &Value) -> String {
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
                    out.push_str(", ");
                }
                write_value(out, item);
            }
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            for (i, (key, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_string(out, key);
                out.push_str(": ");
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
        Some(f) => out.push_str(&python_float_repr(f)),
        None => {
            let _ = write!(out, "{n}");
        }
    }
}

/// Python's `repr(float)`: the shortest round-tripping digits, positional for exponents in
/// [-4, 16), otherwise scientific with a signed, at least two-digit exponent (`1e+16`, `1.5e-05`).
pub fn python_float_repr(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 {
            "Infinity".into()
        } else {
            "-Infinity".into()
        };
    }
    if f == 0.0 {
        return if f.is_sign_negative() {
            "-0.0".into()
        } else {
            "0.0".into()
        };
    }
    // `{:e}` gives the shortest round-trip digits: "d.ddddde<exp>".
    let sci = format!("{:e}", f);
    let (mantissa, exp) = match sci.split_once('e') {
        Some((m, e)) => (m.to_string(), e.parse::<i32>().unwrap_or(0)),
        None => return sci,
    };
    let negative = mantissa.starts_with('-');
    let digits: String = mantissa.chars().filter(|c| c.is_ascii_digit()).collect();
    let sign = if negative { "-" } else { "" };
    if (-4..16).contains(&exp) {
        let point = exp + 1; // digits before the decimal point
        if point <= 0 {
            format!("{sign}0.{}{}", "0".repeat((-point) as usize), digits)
        } else if (point as usize) >= digits.len() {
            format!(
                "{sign}{}{}.0",
                digits,
                "0".repeat(point as usize - digits.len())
            )
        } else {
            let (int, frac) = digits.split_at(point as usize);
            format!("{sign}{int}.{frac}")
        }
    } else {
        let (first, rest) = digits.split_at(1);
        let mant = if rest.is_empty() {
            first.to_string()
        } else {
            format!("{first}.{rest}")
        };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{mant}e{esign}{:02}", exp.abs())
    }
}

fn write_string(out: &mut String, s: &str) {
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

    #[test]
    fn objects_use_python_separators_and_keep_unicode() {
        let v = json!({"name": "Zoë", "n": 3, "tags": ["a", "b"], "ok": true, "x": null});
        assert_eq!(
            python_json(&v),
            r#"{"name": "Zoë", "n": 3, "tags": ["a", "b"], "ok": true, "x": null}"#
        );
    }

    #[test]
    fn strings_escape_like_python() {
        let v = json!("a\"b\\c\nd\u{1}e/é");
        assert_eq!(python_json(&v), "\"a\\\"b\\\\c\\nd\\u0001e/é\"");
    }

    #[test]
    fn floats_follow_python_repr() {
        assert_eq!(python_float_repr(1.5), "1.5");
        assert_eq!(python_float_repr(100.0), "100.0");
        assert_eq!(python_float_repr(0.1), "0.1");
        assert_eq!(python_float_repr(1e16), "1e+16");
        assert_eq!(python_float_repr(1.5e-5), "1.5e-05");
        assert_eq!(python_float_repr(0.0001), "0.0001");
        assert_eq!(python_float_repr(123456789.125), "123456789.125");
        assert_eq!(python_float_repr(-2.5e20), "-2.5e+20");
        assert_eq!(python_float_repr(1e15), "1000000000000000.0");
    }

    #[test]
    fn plain_strings_and_null_render_as_text() {
        assert_eq!(render_value(&json!("hello")), "hello");
        assert_eq!(render_value(&Value::Null), "");
        assert_eq!(render_value(&json!([1, 2.0])), "[1, 2.0]");
    }
}
