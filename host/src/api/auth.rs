//! The one bearer-key check: the API's keys (`Authorization: Bearer KEY`) and the policy admin
//! key are both compared here, in constant time, with the `Bearer` scheme matched without regard
//! to case (RFC 9110 §11.1: auth schemes are case-insensitive).

use subtle::ConstantTimeEq;

/// The token of an `Authorization: Bearer TOKEN` header value, trimmed; `None` for another
/// scheme or none.
pub fn bearer_token(authorization: &str) -> Option<&str> {
    let (scheme, token) = authorization.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// Whether `presented` equals one of `keys`. Every key is compared in constant time, and all of
/// them are compared, so timing says nothing about which key nearly matched.
pub fn matches_any<'a>(keys: impl IntoIterator<Item = &'a [u8]>, presented: &str) -> bool {
    let mut ok = subtle::Choice::from(0u8);
    for key in keys {
        ok |= key.ct_eq(presented.as_bytes());
    }
    ok.into()
}

/// Whether `headers` carry the admin key `expected`: `X-Admin-Key: KEY`, or
/// `Authorization: Bearer KEY` (when API keys are on, `Authorization` carries the caller's API
/// key, so `X-Admin-Key` is looked at first). Every admin route (policy deployments, model
/// loads and unloads) checks it here.
pub fn admin_key_matches(expected: &str, headers: &axum::http::HeaderMap) -> bool {
    let candidates = [
        headers
            .get("x-admin-key")
            .and_then(|v| v.to_str().ok())
            .map(str::trim),
        headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(bearer_token),
    ];
    candidates.iter().flatten().fold(false, |acc, key| {
        acc | matches_any([expected.as_bytes()], key)
    })
}

/// Bearer keys. Empty = auth off: any `Authorization` header (or none) is accepted.
#[derive(Debug, Clone, Default)]
pub struct ApiKeys(Vec<Vec<u8>>);

impl ApiKeys {
    pub fn new(keys: impl IntoIterator<Item = String>) -> Self {
        ApiKeys(
            keys.into_iter()
                .map(|k| k.trim().to_string())
                .filter(|k| !k.is_empty())
                .map(String::into_bytes)
                .collect(),
        )
    }

    pub fn enabled(&self) -> bool {
        !self.0.is_empty()
    }

    /// Whether `key` itself is one of the keys (a console login); never with auth off.
    pub fn accepts(&self, key: &str) -> bool {
        self.enabled() && matches_any(self.0.iter().map(Vec::as_slice), key.trim())
    }

    /// Whether `authorization` (the header's value) carries one of the keys.
    pub fn allows(&self, authorization: Option<&str>) -> bool {
        if !self.enabled() {
            return true;
        }
        authorization
            .and_then(bearer_token)
            .is_some_and(|token| matches_any(self.0.iter().map(Vec::as_slice), token))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_need_bearer_and_an_exact_match() {
        let keys = ApiKeys::new(["secret".to_string(), "other".to_string()]);
        assert!(keys.allows(Some("Bearer secret")));
        assert!(keys.allows(Some("bearer other")));
        assert!(!keys.allows(Some("Bearer secre")));
        assert!(!keys.allows(Some("Bearer secrets")));
        assert!(!keys.allows(Some("secret")));
        assert!(!keys.allows(Some("Basic secret")));
        assert!(!keys.allows(None));
        assert!(keys.accepts("other") && !keys.accepts("othe") && !keys.accepts(""));
        let off = ApiKeys::new(Vec::<String>::new());
        assert!(off.allows(Some("Bearer anything")));
        assert!(off.allows(None));
        assert!(!off.accepts("anything"));
    }

    #[test]
    fn bearer_tokens_are_trimmed_and_never_empty() {
        assert_eq!(bearer_token("  BEARER  k  "), Some("k"));
        assert_eq!(bearer_token("Bearer "), None);
        assert_eq!(bearer_token("Token k"), None);
    }
}
