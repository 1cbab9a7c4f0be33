//! The one check of the URLs the host's own HTTP client is given (`--upstream`, `--server`,
//! `--decision-log-url`). That client is built without a TLS backend for now, so an `https://`
//! URL is refused when the setting is read, with the cause, instead of failing at every request
//! with a transport error.

/// Why a URL cannot be used by the host's HTTP client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    #[error(
        "{flag} {url:?}: https:// is not supported yet (this build's HTTP client has no TLS); \
         use an http:// URL, e.g. through a TLS-terminating proxy on the same host"
    )]
    HttpsUnsupported { flag: &'static str, url: String },
    #[error("{flag} must be an http:// URL, got {url:?}")]
    NotHttp { flag: &'static str, url: String },
}

/// Accepts `http://…`; names `flag` and the URL otherwise.
pub fn check(flag: &'static str, url: &str) -> Result<(), UrlError> {
    let lower = url.trim().to_ascii_lowercase();
    if lower.starts_with("http://") {
        Ok(())
    } else if lower.starts_with("https://") {
        Err(UrlError::HttpsUnsupported {
            flag,
            url: url.to_string(),
        })
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
    fn http_is_taken_https_is_refused_with_its_cause_and_the_rest_is_named() {
        assert_eq!(check("--server", "http://127.0.0.1:8080"), Ok(()));
        let https = check("--server", "https://example.com").unwrap_err();
        assert!(matches!(https, UrlError::HttpsUnsupported { .. }));
        assert!(https.to_string().contains("no TLS"), "{https}");
        let other = check("--upstream", "ftp://x").unwrap_err();
        assert!(other.to_string().contains("--upstream"), "{other}");
    }
}
