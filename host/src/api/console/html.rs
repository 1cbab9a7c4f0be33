//! The console's HTML: one escaping function every piece of text goes through, the page shell
//! (navigation, who is logged in, the CSRF token for forms) and the small drawings (bars) the
//! pages share.
//!
//! Pages are built with `write!` into a `String`. Text that did not come from this module's own
//! literals — a request's state, a policy's name, a model's description, an error message — goes
//! through [`esc`] (or [`Text`], its `Display` form) on its way in. Nothing is ever inlined as
//! script or style: the Content-Security-Policy (`console/mod.rs`) allows only `/console/assets/`.

use super::session::{Role, Viewer};
use std::fmt::{self, Write};

/// `text` escaped for HTML text and for double-quoted attribute values.
pub fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Text that prints escaped: `write!(out, "<td>{}</td>", Text(&name))`.
pub struct Text<'a>(pub &'a str);

impl fmt::Display for Text<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&esc(self.0))
    }
}

/// The console's pages, in the navigation's order: (path, title).
pub const PAGES: &[(&str, &str)] = &[
    ("/console", "Overview"),
    ("/console/models", "Models"),
    ("/console/policies", "Policies"),
    ("/console/decisions", "Decisions"),
    ("/console/calibration", "Calibration"),
    ("/console/ask", "Ask"),
];

/// A whole page: the head (stylesheet and script from `/console/assets/`), the navigation with
/// `current` marked, who is logged in, an optional message, then `body`.
pub fn layout(
    title: &str,
    current: &str,
    viewer: &Viewer,
    flash: Option<&str>,
    body: &str,
) -> String {
    let mut out = String::with_capacity(body.len() + 2048);
    let _ = write!(
        out,
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
<title>{} · Hunch console</title>\
<link rel=\"icon\" href=\"data:,\"><link rel=\"stylesheet\" href=\"/console/assets/console.css\">\
<script src=\"/console/assets/console.js\" defer></script></head>\
<body data-csrf=\"{}\"><header><a class=\"brand\" href=\"/console\">Hunch</a><nav>",
        Text(title),
        Text(&viewer.csrf)
    );
    for (path, name) in PAGES {
        let here = if *path == current {
            " aria-current=\"page\""
        } else {
            ""
        };
        let _ = write!(out, "<a href=\"{path}\"{here}>{name}</a>");
    }
    out.push_str("</nav><div class=\"who\">");
    match viewer.role {
        Role::Open => out.push_str("<span class=\"badge\">open · read-only</span>"),
        Role::Viewer => out.push_str("<span class=\"badge\">API key · read-only</span>"),
        Role::Admin => out.push_str("<span class=\"badge admin\">admin</span>"),
    }
    if viewer.role != Role::Open {
        let _ = write!(
            out,
            "<form method=\"post\" action=\"/console/logout\" class=\"inline\">{}\
<button type=\"submit\" class=\"link\">Log out</button></form>",
            csrf_field(viewer)
        );
    }
    out.push_str("</div></header><main>");
    if viewer.role == Role::Open {
        out.push_str(
            "<p class=\"note\">No keys are configured, so this console is open and read-only. \
Start the server with <code>--admin-key KEY</code> (or <code>HUNCH_ADMIN_KEY</code>) to log in \
and promote or roll back policies here.</p>",
        );
    }
    if let Some(message) = flash {
        let _ = write!(
            out,
            "<p class=\"flash\" role=\"status\">{}</p>",
            Text(message)
        );
    }
    let _ = write!(out, "<h1>{}</h1>", Text(title));
    out.push_str(body);
    out.push_str("</main></body></html>\n");
    out
}

/// The hidden form field every console form carries.
pub fn csrf_field(viewer: &Viewer) -> String {
    format!(
        "<input type=\"hidden\" name=\"csrf\" value=\"{}\">",
        Text(&viewer.csrf)
    )
}

/// A horizontal bar of `share` (0–1) drawn as SVG: its width is an attribute, not a style, so
/// the page needs no inline style under its CSP.
pub fn bar(share: f64, class: &str) -> String {
    let width = if share.is_finite() {
        (share.clamp(0.0, 1.0) * 100.0 * 10.0).round() / 10.0
    } else {
        0.0
    };
    format!(
        "<svg class=\"bar {class}\" viewBox=\"0 0 100 10\" preserveAspectRatio=\"none\" \
role=\"img\" aria-label=\"{width}%\"><rect class=\"track\" width=\"100\" height=\"10\"/>\
<rect class=\"fill\" width=\"{width}\" height=\"10\"/></svg>"
    )
}

/// One row of a probability table: label, bar, percentage.
pub fn probability_row(label: &str, p: f64, class: &str) -> String {
    format!(
        "<tr><td class=\"label\">{}</td><td class=\"barcell\">{}</td><td class=\"num\">{:.1}%</td></tr>",
        Text(label),
        bar(p, class),
        100.0 * p
    )
}

/// Bytes as people read them (KiB, MiB, GiB).
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// A duration in seconds as people read it (`42 s`, `3 min`, `2 h 5 min`).
pub fn seconds(s: f64) -> String {
    if !s.is_finite() || s < 0.0 {
        return "–".into();
    }
    let s = s.round() as u64;
    match s {
        0..=119 => format!("{s} s"),
        120..=7199 => format!("{} min", s / 60),
        _ => format!("{} h {} min", s / 3600, (s % 3600) / 60),
    }
}

/// Unix milliseconds as an RFC 3339 time (UTC, seconds).
pub fn unix_ms(ms: u64) -> String {
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
    let text = crate::decision::event::rfc3339_ms(at);
    // `…:ss.mmmZ` → `…:ssZ`: milliseconds say nothing on a page.
    match text.rsplit_once('.') {
        Some((head, _)) => format!("{head}Z"),
        None => text,
    }
}

/// JSON pretty-printed and escaped, in a `<pre>`.
pub fn json_block(value: &serde_json::Value) -> String {
    let text = serde_json::to_string_pretty(value).unwrap_or_else(|e| e.to_string());
    format!("<pre class=\"json\">{}</pre>", Text(&text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_markup_character_is_escaped() {
        assert_eq!(
            esc("<script>alert(1)</script>"),
            "&lt;script&gt;alert(1)&lt;/script&gt;"
        );
        assert_eq!(
            esc("\"><img src=x onerror='alert(1)'>&"),
            "&quot;&gt;&lt;img src=x onerror=&#39;alert(1)&#39;&gt;&amp;"
        );
        assert_eq!(Text("a<b").to_string(), "a&lt;b");
    }

    #[test]
    fn bars_clamp_and_never_print_nan() {
        assert!(bar(0.25, "p").contains("width=\"25\""));
        assert!(bar(2.0, "p").contains("class=\"fill\" width=\"100\""));
        assert!(bar(f64::NAN, "p").contains("class=\"fill\" width=\"0\""));
    }

    #[test]
    fn sizes_and_durations_read_well() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(3 << 30), "3.0 GiB");
        assert_eq!(seconds(42.4), "42 s");
        assert_eq!(seconds(600.0), "10 min");
        assert_eq!(unix_ms(0), "1970-01-01T00:00:00Z");
    }
}
