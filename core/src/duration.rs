//! Durations as people write them in flags, config files and request fields: `500ms`, `30s`,
//! `5m`, `1h`, or a bare number of seconds. One reading for all of them (`--model-ttl`, the
//! bundle's intervals, `x_keep_alive`, a model's `ttl`); each caller holds the result to its own
//! bounds.

use std::time::Duration;

/// `text` as a duration: a non-negative number (`.` allowed) then an optional unit, `ms`, `s`,
/// `m` or `h` (none: seconds), spaces around either ignored. `None` for anything else.
pub fn parse(text: &str) -> Option<Duration> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let scale = match unit.trim() {
        "" | "s" => 1.0,
        "ms" => 1e-3,
        "m" => 60.0,
        "h" => 3600.0,
        _ => return None,
    };
    Duration::try_from_secs_f64(number.parse::<f64>().ok()? * scale).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_and_bare_seconds() {
        assert_eq!(parse("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse("30s"), Some(Duration::from_secs(30)));
        assert_eq!(parse(" 5m "), Some(Duration::from_secs(300)));
        assert_eq!(parse("10 s"), Some(Duration::from_secs(10)));
        assert_eq!(parse("1.5h"), Some(Duration::from_secs(5400)));
        assert_eq!(parse("90"), Some(Duration::from_secs(90)));
        assert_eq!(parse("0"), Some(Duration::ZERO));
        for bad in ["", "soon", "5d", "-1s", "1.2.3s", "ms"] {
            assert_eq!(parse(bad), None, "{bad}");
        }
    }
}
