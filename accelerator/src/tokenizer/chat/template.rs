//! Chat templates: the Jinja source a model ships, rendered as transformers'
//! `apply_chat_template` renders it.
//!
//! transformers compiles templates in a sandboxed Jinja2 environment with `trim_blocks` and
//! `lstrip_blocks`, a trailing newline of the source dropped, Python's string methods available
//! on values (`.strip()`, `.startswith()`, `.split()` …), and three additions: `raise_exception`,
//! `strftime_now` and a `tojson` filter that is `json.dumps` with `ensure_ascii=False`. minijinja
//! with `minijinja_contrib::pycompat` gives the same, with these differences covered here:
//!
//! - Python's `str.strip()` (and Jinja's `| trim`, which calls it) also strips U+001C–U+001F,
//!   which Rust's `trim` keeps: `strip`/`lstrip`/`rstrip` without arguments and `trim` use
//!   Python's set.
//! - minijinja's own `tojson` escapes `<`, `>`, `&` and `'` for HTML and writes compact JSON;
//!   the filter here writes what `json.dumps` writes (`", "` and `": "` separators, `indent`),
//!   a mapping's keys in insertion order as Python keeps them (minijinja's `preserve_order`).
//! - transformers' `{% generation %}` … `{% endgeneration %}` (which marks assistant text for
//!   training masks and renders its body unchanged) is read as `{% if true %}` … `{% endif %}`.

use super::ChatMessage;
use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, Error, ErrorKind, State};

/// Marks the errors `raise_exception` produces, so that a template refusing its input is told
/// apart from a template that is broken.
const RAISED: &str = "raise_exception: ";
const NAME: &str = "chat";

/// A compiled chat template.
pub(super) struct ChatTemplate {
    env: Environment<'static>,
}

/// The special-token texts a template sees as variables (transformers passes the tokenizer's
/// special tokens map); `None` leaves the variable undefined.
#[derive(Debug, Clone, Default)]
pub(super) struct TemplateTokens {
    pub bos: Option<String>,
    pub eos: Option<String>,
    pub unk: Option<String>,
    pub pad: Option<String>,
}

/// Why a render failed: the template raised (refused the messages), or something else.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum RenderFailure {
    Raised(String),
    Failed(String),
}

impl RenderFailure {
    pub fn message(&self) -> &str {
        match self {
            RenderFailure::Raised(m) | RenderFailure::Failed(m) => m,
        }
    }
}

impl ChatTemplate {
    pub fn new(source: &str) -> Result<ChatTemplate, String> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        env.set_unknown_method_callback(python_methods);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_filter("trim", trim);
        env.add_template_owned(NAME, rewrite_generation_tags(source))
            .map_err(|e| format!("{e:#}"))?;
        Ok(ChatTemplate { env })
    }

    /// The prompt for `messages` with an open assistant turn (`add_generation_prompt=True`) and
    /// thinking off (`enable_thinking=False`).
    pub fn render(
        &self,
        messages: &[ChatMessage],
        tokens: &TemplateTokens,
    ) -> Result<String, RenderFailure> {
        let template = self
            .env
            .get_template(NAME)
            .map_err(|e| RenderFailure::Failed(format!("{e:#}")))?;
        let messages: Vec<Value> = messages
            .iter()
            .map(|m| {
                Value::from_iter([
                    ("role", Value::from(m.role.as_str())),
                    ("content", Value::from(m.content.as_str())),
                ])
            })
            .collect();
        let opt = |s: &Option<String>| s.as_deref().map_or(Value::UNDEFINED, Value::from);
        let ctx = Value::from_iter([
            ("messages", Value::from(messages)),
            ("add_generation_prompt", Value::from(true)),
            ("enable_thinking", Value::from(false)),
            ("tools", Value::from(())),
            ("documents", Value::from(())),
            ("bos_token", opt(&tokens.bos)),
            ("eos_token", opt(&tokens.eos)),
            ("unk_token", opt(&tokens.unk)),
            ("pad_token", opt(&tokens.pad)),
        ]);
        template.render(ctx).map_err(|e| {
            let raised = std::iter::successors(Some(&e as &dyn std::error::Error), |e| e.source())
                .find_map(|e| {
                    e.downcast_ref::<Error>()
                        .and_then(Error::detail)
                        .and_then(|d| d.strip_prefix(RAISED))
                });
            match raised {
                Some(message) => RenderFailure::Raised(message.to_string()),
                None => RenderFailure::Failed(format!("{e:#}")),
            }
        })
    }
}

impl ChatTemplate {
    /// The template over `context`, a JSON object whose keys become the template's variables
    /// (a decision model's `systemone` template takes the question, the state and the options
    /// as raw JSON values; `read::decision`).
    pub fn render_json(&self, context: &serde_json::Value) -> Result<String, RenderFailure> {
        let template = self
            .env
            .get_template(NAME)
            .map_err(|e| RenderFailure::Failed(format!("{e:#}")))?;
        template
            .render(Value::from_serialize(context))
            .map_err(|e| RenderFailure::Failed(format!("{e:#}")))
    }

    /// The variables the template reads that it does not set itself.
    pub fn variables(&self) -> Vec<String> {
        self.env
            .get_template(NAME)
            .map(|t| t.undeclared_variables(false).into_iter().collect())
            .unwrap_or_default()
    }
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(
        ErrorKind::InvalidOperation,
        format!("{RAISED}{message}"),
    ))
}

/// Python's `str.isspace()` characters: Rust's white space and the separators U+001C–U+001F.
fn is_python_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// `strip`, `lstrip` and `rstrip` without arguments strip Python's white space; everything else
/// goes to pycompat.
fn python_methods(
    state: &State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> Result<Value, Error> {
    if let (Some(s), []) = (value.as_str(), args) {
        match method {
            "strip" => return Ok(Value::from(s.trim_matches(is_python_space))),
            "lstrip" => return Ok(Value::from(s.trim_start_matches(is_python_space))),
            "rstrip" => return Ok(Value::from(s.trim_end_matches(is_python_space))),
            _ => {}
        }
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

/// Jinja2's `trim(value, chars=None)`: `str.strip(chars)`.
fn trim(value: &str, chars: Option<&str>) -> String {
    match chars {
        Some(chars) => value.trim_matches(|c: char| chars.contains(c)).to_string(),
        None => value.trim_matches(is_python_space).to_string(),
    }
}

/// transformers' `tojson`: `json.dumps(x, ensure_ascii=False, indent=indent,
/// separators=separators, sort_keys=sort_keys)`.
fn tojson(value: &Value, indent: Option<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match indent {
        Some(i) => Some(i),
        None => kwargs.get::<Option<Value>>("indent")?,
    };
    let ensure_ascii = kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false);
    let sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    let separators = kwargs.get::<Option<Vec<String>>>("separators")?;
    kwargs.assert_all_used()?;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) => match (v.as_i64(), v.as_str()) {
            (Some(n), _) => Some(" ".repeat(usize::try_from(n).unwrap_or(0))),
            (_, Some(s)) => Some(s.to_string()),
            _ => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: indent must be an integer or a string",
                ))
            }
        },
    };
    let (item, key) = match separators.as_deref() {
        Some([item, key]) => (item.clone(), key.clone()),
        Some(_) => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "tojson: separators must be two strings",
            ))
        }
        None if indent.is_some() => (",".to_string(), ": ".to_string()),
        None => (", ".to_string(), ": ".to_string()),
    };
    let json = serde_json::to_value(value)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let style = JsonStyle {
        indent,
        item,
        key,
        ensure_ascii,
        sort_keys,
    };
    let mut out = String::new();
    style.write(&json, 0, &mut out);
    Ok(Value::from(out))
}

/// `json.dumps`'s output format.
struct JsonStyle {
    indent: Option<String>,
    item: String,
    key: String,
    ensure_ascii: bool,
    sort_keys: bool,
}

impl JsonStyle {
    fn write(&self, v: &serde_json::Value, depth: usize, out: &mut String) {
        use serde_json::Value as J;
        match v {
            J::Array(items) if !items.is_empty() => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    self.separate(i, depth + 1, out);
                    self.write(item, depth + 1, out);
                }
                self.close(depth, out);
                out.push(']');
            }
            J::Object(map) if !map.is_empty() => {
                let mut entries: Vec<_> = map.iter().collect();
                if self.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(b.0));
                }
                out.push('{');
                for (i, (k, item)) in entries.into_iter().enumerate() {
                    self.separate(i, depth + 1, out);
                    self.string(k, out);
                    out.push_str(&self.key);
                    self.write(item, depth + 1, out);
                }
                self.close(depth, out);
                out.push('}');
            }
            J::String(s) => self.string(s, out),
            other => out.push_str(&other.to_string()),
        }
    }

    fn separate(&self, index: usize, depth: usize, out: &mut String) {
        if index > 0 {
            out.push_str(&self.item);
        }
        if let Some(indent) = &self.indent {
            out.push('\n');
            out.push_str(&indent.repeat(depth));
        }
    }

    fn close(&self, depth: usize, out: &mut String) {
        if let Some(indent) = &self.indent {
            out.push('\n');
            out.push_str(&indent.repeat(depth));
        }
    }

    fn string(&self, s: &str, out: &mut String) {
        // serde_json escapes exactly what json.dumps does with ensure_ascii=False.
        let quoted = serde_json::Value::from(s).to_string();
        if !self.ensure_ascii {
            out.push_str(&quoted);
            return;
        }
        for c in quoted.chars() {
            if c.is_ascii() {
                out.push(c);
            } else {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
        }
    }
}

/// `strftime_now(format)`: the current UTC time formatted as Python's `strftime` does, for the
/// directives templates use (`%d %b %Y` in Llama 3's).
fn strftime_now(format: &str) -> Result<Value, Error> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    strftime(format, now).map(Value::from)
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const DAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// Year, month (1–12) and day (1–31) of a day count since 1970-01-01 (proleptic Gregorian).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = (if mp < 10 { mp + 3 } else { mp - 9 }) as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

pub(super) fn strftime(format: &str, unix_seconds: u64) -> Result<String, Error> {
    let days = (unix_seconds / 86_400) as i64;
    let secs = unix_seconds % 86_400;
    let (year, month, day) = civil_from_days(days);
    let (hour, minute, second) = (secs / 3600, secs / 60 % 60, secs % 60);
    // 1970-01-01 was a Thursday (index 3 from Monday).
    let weekday = (days + 3).rem_euclid(7) as usize;
    let jan1 = days - (1..month).map(|m| month_days(year, m)).sum::<i64>() - i64::from(day) + 1;
    let yday = days - jan1 + 1;
    let month_name = MONTHS[month as usize - 1];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let Some(d) = chars.next() else {
            out.push('%');
            break;
        };
        match d {
            'd' => out.push_str(&format!("{day:02}")),
            '-' if chars.clone().next() == Some('d') => {
                chars.next();
                out.push_str(&day.to_string());
            }
            'e' => out.push_str(&format!("{day:>2}")),
            'm' => out.push_str(&format!("{month:02}")),
            'Y' => out.push_str(&year.to_string()),
            'y' => out.push_str(&format!("{:02}", year.rem_euclid(100))),
            'b' | 'h' => out.push_str(&month_name[..3]),
            'B' => out.push_str(month_name),
            'a' => out.push_str(&DAYS[weekday][..3]),
            'A' => out.push_str(DAYS[weekday]),
            'H' => out.push_str(&format!("{hour:02}")),
            'I' => out.push_str(&format!("{:02}", (hour + 11) % 12 + 1)),
            'p' => out.push_str(if hour < 12 { "AM" } else { "PM" }),
            'M' => out.push_str(&format!("{minute:02}")),
            'S' => out.push_str(&format!("{second:02}")),
            'j' => out.push_str(&format!("{yday:03}")),
            'F' => out.push_str(&format!("{year}-{month:02}-{day:02}")),
            'T' => out.push_str(&format!("{hour:02}:{minute:02}:{second:02}")),
            '%' => out.push('%'),
            other => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("strftime_now: unsupported directive %{other}"),
                ))
            }
        }
    }
    Ok(out)
}

fn month_days(year: i64, month: u32) -> i64 {
    match month {
        2 if (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// `{% generation %}` → `{% if true %}` and `{% endgeneration %}` → `{% endif %}`, keeping each
/// tag's whitespace-control marks.
fn rewrite_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        out.push_str(&rest[..start]);
        let tag = &rest[start..];
        let Some(end) = tag.find("%}") else {
            out.push_str(tag);
            return out;
        };
        let inner = &tag[2..end];
        let (open, body) = match inner.strip_prefix(['-', '+']) {
            Some(b) => (&inner[..1], b),
            None => ("", inner),
        };
        let (body, close) = match body.strip_suffix(['-', '+']) {
            Some(b) => (b, &body[b.len()..]),
            None => (body, ""),
        };
        let word = match body.trim() {
            "generation" => Some("if true"),
            "endgeneration" => Some("endif"),
            _ => None,
        };
        match word {
            Some(word) => out.push_str(&format!("{{%{open} {word} {close}%}}")),
            None => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(role: &str, content: &str) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }

    fn render(source: &str, messages: &[ChatMessage]) -> Result<String, RenderFailure> {
        let tokens = TemplateTokens {
            bos: Some("<s>".into()),
            eos: Some("</s>".into()),
            ..TemplateTokens::default()
        };
        ChatTemplate::new(source)
            .expect("compiles")
            .render(messages, &tokens)
    }

    #[test]
    fn blocks_are_trimmed_as_transformers_does() {
        let source = "{% for m in messages %}\n  {% if m.role == 'user' %}\n[{{ m.content }}]\n  {% endif %}\n{% endfor %}\n{% if add_generation_prompt %}>{% endif %}\n";
        let out = render(source, &[msg("user", "a"), msg("user", "b")]).expect("renders");
        assert_eq!(out, "[a]\n[b]\n>");
    }

    #[test]
    fn python_string_methods_and_trim() {
        let source = "{{ bos_token }}{{ messages[0].content.strip() }}|{{ messages[0].content | trim }}|{{ messages[0].content.startswith(' x') }}|{{ 'a,b'.split(',')[1] }}|{{ enable_thinking }}";
        let out = render(source, &[msg("user", " x\u{1f} ")]).expect("renders");
        // Booleans print as Python's.
        assert_eq!(out, "<s>x|x|True|b|False");
    }

    #[test]
    fn raise_exception_is_told_apart() {
        let source = "{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}ok";
        let failure = render(source, &[msg("system", "s")]).expect_err("raises");
        assert_eq!(
            failure,
            RenderFailure::Raised("System role not supported".into())
        );
        let broken = render("{{ 1 + [] }}", &[]).expect_err("fails");
        assert!(matches!(broken, RenderFailure::Failed(_)), "{broken:?}");
    }

    #[test]
    fn tojson_is_json_dumps() {
        let source = "{{ {'a': [1, 'é<'], 'b': none} | tojson }}|{{ [1, 2] | tojson(indent=2) }}|{{ 'x' | tojson(ensure_ascii=true) }}";
        let out = render(source, &[]).expect("renders");
        assert_eq!(
            out,
            "{\"a\": [1, \"é<\"], \"b\": null}|[\n  1,\n  2\n]|\"x\""
        );
        let ascii = render("{{ 'é😀' | tojson(ensure_ascii=true) }}", &[]).expect("renders");
        assert_eq!(ascii, "\"\\u00e9\\ud83d\\ude00\"");
    }

    #[test]
    fn generation_tags_render_their_body() {
        let source = "{% for m in messages %}{%- generation -%} {{ m.content }} {%- endgeneration %}{% endfor %}";
        assert_eq!(
            render(source, &[msg("assistant", "hi")]).expect("renders"),
            "hi"
        );
    }

    #[test]
    fn strftime_formats_dates() {
        // 2024-07-26 13:05:09 UTC, a Friday, day 208 of a leap year.
        let t = 1_722_000_000 - 1_722_000_000 % 86_400 + 13 * 3600 + 5 * 60 + 9;
        assert_eq!(
            strftime("%d %b %Y|%B %-d|%A %a|%H:%M:%S|%j|%y %m|%F %I%p %%", t).expect("formats"),
            "26 Jul 2024|July 26|Friday Fri|13:05:09|208|24 07|2024-07-26 01PM %"
        );
        assert_eq!(strftime("%Y-%m-%d", 0).expect("formats"), "1970-01-01");
        assert!(strftime("%Q", 0).is_err());
        let now = render("{{ strftime_now('%Y') }}", &[]).expect("renders");
        assert!(now.len() == 4 && now.starts_with('2'), "{now}");
    }
}
