//! Console sessions: who is looking and what they may do.
//!
//! A login exchanges a key (the admin key, or one of the API keys) for a session: a random id
//! kept server-side (only its SHA-256 is stored, so the map's lookups reveal nothing usable) and
//! sent to the browser as an `HttpOnly`, `SameSite=Strict` cookie scoped to `/console`. The key
//! itself never leaves the login request. Each session has its own CSRF token, which every
//! console form carries and every POST has checked, and an expiry.
//!
//! With no key configured at all the console is open: each browser gets an anonymous session,
//! made on its first visit, only so that its forms (Ask) have a CSRF token too.

use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The cookie's name.
pub const COOKIE: &str = "hunch_console";
/// How long a session lasts after its login.
pub const LIFETIME: Duration = Duration::from_secs(8 * 3600);
/// Sessions kept at most; beyond, the one closest to expiring is forgotten (a flood of logins or
/// open-console visitors cannot grow the server's memory).
const MAX_SESSIONS: usize = 4096;

/// What a session may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// No key is configured: read and ask, no actions.
    Open,
    /// Logged in with an API key: read and ask, no actions.
    Viewer,
    /// Logged in with the admin key: everything, promote and roll back included.
    Admin,
}

impl Role {
    /// Whether this role may change what the server serves (promote, roll back).
    pub fn can_act(self) -> bool {
        self == Role::Admin
    }
}

/// The session a console request runs in, as handlers see it.
#[derive(Debug, Clone)]
pub struct Viewer {
    pub role: Role,
    /// The token this session's forms carry.
    pub csrf: String,
    /// The session's key in the store (sha256 of its id), for flash messages and logout.
    pub key: String,
}

#[derive(Debug)]
struct Session {
    role: Role,
    csrf: String,
    expires: Instant,
    /// A message for the next page this session sees (the outcome of a POST).
    flash: Option<String>,
}

/// The server-side session store.
#[derive(Debug, Default)]
pub struct Sessions {
    by_key: Mutex<HashMap<String, Session>>,
}

/// 32 random bytes as hex: a session id or a CSRF token.
fn token() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

fn key_of(id: &str) -> String {
    Sha256::digest(id.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl Sessions {
    /// A new session for `role`: its id (for the cookie, and nowhere else) and the viewer.
    pub fn create(&self, role: Role) -> Result<(String, Viewer), getrandom::Error> {
        let id = token()?;
        let csrf = token()?;
        let key = key_of(&id);
        let now = Instant::now();
        let mut map = self.by_key.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|_, s| s.expires > now);
        if map.len() >= MAX_SESSIONS {
            if let Some(oldest) = map
                .iter()
                .min_by_key(|(_, s)| s.expires)
                .map(|(k, _)| k.clone())
            {
                map.remove(&oldest);
            }
        }
        map.insert(
            key.clone(),
            Session {
                role,
                csrf: csrf.clone(),
                expires: now + LIFETIME,
                flash: None,
            },
        );
        Ok((id, Viewer { role, csrf, key }))
    }

    /// The live session whose id the cookie carries.
    pub fn find(&self, id: &str) -> Option<Viewer> {
        let key = key_of(id);
        let mut map = self.by_key.lock().unwrap_or_else(|p| p.into_inner());
        let session = map.get(&key)?;
        if session.expires <= Instant::now() {
            map.remove(&key);
            return None;
        }
        Some(Viewer {
            role: session.role,
            csrf: session.csrf.clone(),
            key,
        })
    }

    pub fn remove(&self, viewer: &Viewer) {
        let mut map = self.by_key.lock().unwrap_or_else(|p| p.into_inner());
        map.remove(&viewer.key);
    }

    /// Leaves a message for the session's next page.
    pub fn flash(&self, viewer: &Viewer, message: String) {
        let mut map = self.by_key.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = map.get_mut(&viewer.key) {
            s.flash = Some(message);
        }
    }

    /// The message left for this page, once.
    pub fn take_flash(&self, viewer: &Viewer) -> Option<String> {
        let mut map = self.by_key.lock().unwrap_or_else(|p| p.into_inner());
        map.get_mut(&viewer.key).and_then(|s| s.flash.take())
    }
}

/// Whether `presented` is this session's CSRF token (compared in constant time).
pub fn csrf_ok(viewer: &Viewer, presented: &str) -> bool {
    crate::api::auth::matches_any([viewer.csrf.as_bytes()], presented)
}

/// The session id a request's `Cookie` headers carry, if any.
pub fn cookie_id(headers: &axum::http::HeaderMap) -> Option<String> {
    headers
        .get_all(axum::http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.trim().to_string())
        .filter(|v| !v.is_empty())
}

/// The `Set-Cookie` value for a new session.
pub fn set_cookie(id: &str) -> String {
    format!(
        "{COOKIE}={id}; Path=/console; HttpOnly; SameSite=Strict; Max-Age={}",
        LIFETIME.as_secs()
    )
}

/// The `Set-Cookie` value that ends a session in the browser.
pub fn clear_cookie() -> String {
    format!("{COOKIE}=; Path=/console; HttpOnly; SameSite=Strict; Max-Age=0")
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::{header, HeaderMap, HeaderValue};

    #[test]
    fn a_session_is_found_by_its_id_only_and_carries_its_own_csrf_token() {
        let sessions = Sessions::default();
        let (id, viewer) = sessions.create(Role::Admin).unwrap();
        assert_eq!(id.len(), 64);
        let found = sessions.find(&id).unwrap();
        assert_eq!(found.role, Role::Admin);
        assert_eq!(found.csrf, viewer.csrf);
        assert_ne!(found.csrf, id);
        assert!(csrf_ok(&found, &viewer.csrf));
        assert!(!csrf_ok(&found, "nope"));
        assert!(
            sessions.find(&viewer.key).is_none(),
            "the stored key is no id"
        );
        assert!(sessions.find("x").is_none());
        sessions.flash(&found, "done".into());
        assert_eq!(sessions.take_flash(&found).as_deref(), Some("done"));
        assert_eq!(sessions.take_flash(&found), None);
        sessions.remove(&found);
        assert!(sessions.find(&id).is_none());
    }

    #[test]
    fn the_store_is_bounded() {
        let sessions = Sessions::default();
        for _ in 0..MAX_SESSIONS + 10 {
            sessions.create(Role::Open).unwrap();
        }
        assert_eq!(sessions.by_key.lock().unwrap().len(), MAX_SESSIONS);
    }

    #[test]
    fn the_cookie_is_read_among_others_and_set_strictly() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; hunch_console=abc ; b=2"),
        );
        assert_eq!(cookie_id(&headers).as_deref(), Some("abc"));
        let set = set_cookie("abc");
        for part in ["HttpOnly", "SameSite=Strict", "Path=/console"] {
            assert!(set.contains(part), "{set}");
        }
    }
}
