//! The one check of the URLs the host's own HTTP client is given (`--upstream`, `--server`,
//! `--decision-log-url`): `http://` or `https://` (rustls, trusting the system's roots and, for
//! upstreams, `--upstream-ca-file`). Anything else is refused when the setting is read, naming
//! the setting, instead of failing at every request with a transport error.

/// Why a URL cannot be used by the host's HTTP client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    #[error("{flag} must be an http:// or https:// URL, got {url:?}")]
    NotHttp { flag: &'static str, url: String },
}

/// Accepts `http://…` and `https://…`; names `flag` and the URL otherwise.
pub fn check(flag: &'static str, url: &str) -> Result<(), UrlError> {
    let lower = url.trim().to_ascii_lowercase();
    if lower.starts_with("http://") || lower.starts_with("https://") {
        Ok(())
    } else {
        Err(UrlError::NotHttp {
            flag,
            url: url.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_and_https_are_taken_and_the_rest_is_named() {
        assert_eq!(check("--server", "http://127.0.0.1:8080"), Ok(()));
        assert_eq!(check("--server", "HTTPS://example.com"), Ok(()));
        let other = check("--upstream", "ftp://x").unwrap_err();
        assert!(other.to_string().contains("--upstream"), "{other}");
        assert!(check("--server", "127.0.0.1:8080").is_err());
    }
}
