//! Basic-then-bearer authentication, as pyarrow's `authenticate_basic_token` speaks it:
//! the Handshake carries `authorization: Basic base64(user:password)` and its response
//! returns `authorization: Bearer <token>`, which every later call carries.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use constant_time_eq::constant_time_eq;
use rand::RngExt;

/// Why a token file cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("token file {path}: {reason}")]
pub struct AuthError {
    path: String,
    reason: String,
}

/// The accepted credentials and the bearer token handed out for them.
#[derive(Clone)]
pub struct Auth {
    credentials: Vec<(String, String)>,
    token: String,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Auth({} users)", self.credentials.len())
    }
}

impl Auth {
    /// Reads `user:password` lines (blank lines and `#` comments skipped).
    pub fn from_file(path: &std::path::Path) -> Result<Self, AuthError> {
        let err = |reason: String| AuthError {
            path: path.display().to_string(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
        let mut credentials = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            match line.split_once(':') {
                Some((user, pass)) if !user.is_empty() && !pass.is_empty() => {
                    credentials.push((user.to_string(), pass.to_string()))
                }
                _ => return Err(err(format!("line {}: expected `user:password`", i + 1))),
            }
        }
        if credentials.is_empty() {
            return Err(err("holds no `user:password` line".into()));
        }
        Ok(Self::new(credentials))
    }

    /// Accepts `credentials`, with a fresh random bearer token.
    pub fn new(credentials: Vec<(String, String)>) -> Self {
        let mut rng = rand::rng();
        let token = (0..32)
            .map(|_| format!("{:x}", rng.random_range(0..16u8)))
            .collect();
        Auth { credentials, token }
    }

    /// The bearer header value for a Handshake's `authorization` header, if it holds valid
    /// Basic credentials.
    pub fn handshake(&self, authorization: Option<&str>) -> Option<String> {
        let encoded = authorization?.strip_prefix("Basic ")?;
        let decoded = STANDARD.decode(encoded.trim()).ok()?;
        let (user, pass) = std::str::from_utf8(&decoded).ok()?.split_once(':')?;
        // Every entry is compared, in constant time, so timing says nothing of which failed.
        let mut ok = false;
        for (u, p) in &self.credentials {
            ok |= constant_time_eq(u.as_bytes(), user.as_bytes())
                & constant_time_eq(p.as_bytes(), pass.as_bytes());
        }
        ok.then(|| format!("Bearer {}", self.token))
    }

    /// Whether a call's `authorization` header carries the bearer token.
    pub fn allows(&self, authorization: Option<&str>) -> bool {
        authorization
            .and_then(|a| a.strip_prefix("Bearer "))
            .is_some_and(|t| constant_time_eq(t.trim().as_bytes(), self.token.as_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_then_bearer() {
        let auth = Auth::new(vec![("alice".into(), "s3cret".into())]);
        let basic = format!("Basic {}", STANDARD.encode("alice:s3cret"));
        let bearer = auth.handshake(Some(&basic)).unwrap();
        assert!(auth.allows(Some(&bearer)));
        assert!(!auth.allows(Some("Bearer nope")));
        assert!(!auth.allows(None));
        let wrong = format!("Basic {}", STANDARD.encode("alice:guess"));
        assert!(auth.handshake(Some(&wrong)).is_none());
        assert!(auth.handshake(Some("Basic !!!")).is_none());
        assert!(auth.handshake(None).is_none());
    }

    #[test]
    fn token_files_are_checked() {
        let dir = std::env::temp_dir().join(format!("hydrant-auth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("t");
        std::fs::write(&f, "# users\nalice:s3cret\n").unwrap();
        assert!(Auth::from_file(&f).is_ok());
        std::fs::write(&f, "alice\n").unwrap();
        let e = Auth::from_file(&f).unwrap_err().to_string();
        assert!(e.contains("line 1") && e.contains("user:password"), "{e}");
        std::fs::write(&f, "\n").unwrap();
        assert!(Auth::from_file(&f).is_err());
    }
}
