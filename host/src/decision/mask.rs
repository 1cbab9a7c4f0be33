//! Per-policy decision-log settings (`[decision_log]` in `NAME.toml`) and the masking they ask
//! for: JSON pointers into the event's `input` and `result` whose values are replaced
//! (`mask`) or removed (`erase`) before the event leaves the process.

use crate::decision::event::DecisionEvent;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What a masked value is replaced with.
pub const MASKED: &str = "<masked>";

/// `[decision_log]` of a policy's `NAME.toml`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyLogConfig {
    /// Pointers (`/input/customer/email`, `/result/reason`; `*` matches every key or index)
    /// whose values are replaced by `"<masked>"`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mask: Vec<String>,
    /// Pointers whose values are removed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub erase: Vec<String>,
    /// Write no event at all for this policy's decisions.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub drop: bool,
    /// Leave the reads' state text out (its sha256 stays), whatever the server-wide setting.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub omit_state: bool,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("decision_log pointer {pointer:?}: {reason}")]
pub struct PointerError {
    pub pointer: String,
    pub reason: &'static str,
}

/// The root (`input` or `result`) and the unescaped tokens below it.
fn parse(pointer: &str) -> Result<(&'static str, Vec<String>), PointerError> {
    let err = |reason| PointerError {
        pointer: pointer.to_string(),
        reason,
    };
    let rest = pointer
        .strip_prefix('/')
        .ok_or_else(|| err("a JSON pointer starts with '/'"))?;
    let mut tokens = rest
        .split('/')
        .map(|t| t.replace("~1", "/").replace("~0", "~"));
    let root = match tokens.next().as_deref() {
        Some("input") => "input",
        Some("result") => "result",
        _ => return Err(err("it must start with /input or /result")),
    };
    Ok((root, tokens.collect()))
}

impl PolicyLogConfig {
    /// Refuses pointers that could never match, so a typo is caught when the policy loads.
    pub fn validate(&self) -> Result<(), PointerError> {
        for p in self.mask.iter().chain(&self.erase) {
            parse(p)?;
        }
        Ok(())
    }

    /// Masks then erases, recording each pointer that matched something.
    pub fn apply(&self, event: &mut DecisionEvent) {
        for (pointers, erase) in [(&self.mask, false), (&self.erase, true)] {
            for p in pointers {
                let Ok((root, tokens)) = parse(p) else {
                    continue;
                };
                let hit = match root {
                    "input" => edit_root(&mut event.input, &tokens, erase),
                    _ => match event.result.as_mut() {
                        Some(result) => edit_root(result, &tokens, erase),
                        None => false,
                    },
                };
                if hit {
                    if erase {
                        event.erased.push(p.clone());
                    } else {
                        event.masked.push(p.clone());
                    }
                }
            }
        }
    }
}

/// A pointer naming the root itself masks (or empties) the whole value.
fn edit_root(value: &mut Value, tokens: &[String], erase: bool) -> bool {
    if tokens.is_empty() {
        if erase {
            *value = Value::Null;
        } else {
            mask(value);
        }
        return true;
    }
    edit(value, tokens, erase)
}

fn mask(slot: &mut Value) {
    *slot = Value::String(MASKED.into());
}

fn edit(value: &mut Value, tokens: &[String], erase: bool) -> bool {
    let (head, rest) = (&tokens[0], &tokens[1..]);
    let last = rest.is_empty();
    if head == "*" {
        // Erasing every child empties the container; anything else visits each child.
        if last && erase {
            return match value {
                Value::Object(m) => !std::mem::take(m).is_empty(),
                Value::Array(a) => !std::mem::take(a).is_empty(),
                _ => false,
            };
        }
        let children: Vec<&mut Value> = match value {
            Value::Object(m) => m.values_mut().collect(),
            Value::Array(a) => a.iter_mut().collect(),
            _ => return false,
        };
        let mut hit = false;
        for child in children {
            hit |= if last {
                mask(child);
                true
            } else {
                edit(child, rest, erase)
            };
        }
        return hit;
    }
    match value {
        Value::Object(map) if last && erase => map.shift_remove(head).is_some(),
        Value::Object(map) if last => map.get_mut(head).map(mask).is_some(),
        Value::Object(map) => map.get_mut(head).is_some_and(|v| edit(v, rest, erase)),
        Value::Array(items) => {
            let Some(i) = head.parse::<usize>().ok().filter(|i| *i < items.len()) else {
                return false;
            };
            if last && erase {
                items.remove(i);
                true
            } else if last {
                mask(&mut items[i]);
                true
            } else {
                edit(&mut items[i], rest, erase)
            }
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn event(input: Value, result: Value) -> DecisionEvent {
        serde_json::from_value(json!({
            "decision_id": "d", "timestamp": "t", "route": "r", "read_algorithm": "a",
            "status": 200, "input": input, "result": result
        }))
        .unwrap()
    }

    #[test]
    fn pointers_mask_and_erase_and_say_which_matched() {
        let cfg = PolicyLogConfig {
            mask: vec![
                "/input/customer/email".into(),
                "/input/lines/*/note".into(),
                "/input/absent".into(),
            ],
            erase: vec!["/result/reason".into(), "/input/a~1b".into()],
            ..Default::default()
        };
        cfg.validate().unwrap();
        let mut e = event(
            json!({"customer": {"email": "x@y", "id": 7}, "lines": [{"note": "n"}, {"note": "m"}], "a/b": 1}),
            json!({"ok": true, "reason": "secret"}),
        );
        cfg.apply(&mut e);
        assert_eq!(
            e.input,
            json!({"customer": {"email": MASKED, "id": 7}, "lines": [{"note": MASKED}, {"note": MASKED}]})
        );
        assert_eq!(e.result, Some(json!({"ok": true})));
        assert_eq!(
            e.masked,
            vec!["/input/customer/email", "/input/lines/*/note"]
        );
        assert_eq!(e.erased, vec!["/result/reason", "/input/a~1b"]);
    }

    #[test]
    fn pointers_outside_input_and_result_are_refused() {
        for bad in ["input/x", "/reads/0", "", "/"] {
            let cfg = PolicyLogConfig {
                mask: vec![bad.into()],
                ..Default::default()
            };
            assert!(cfg.validate().is_err(), "{bad:?}");
        }
        let whole = PolicyLogConfig {
            mask: vec!["/input".into()],
            ..Default::default()
        };
        let mut e = event(json!({"a": 1}), json!(1));
        whole.apply(&mut e);
        assert_eq!(e.input, json!(MASKED));
    }
}
