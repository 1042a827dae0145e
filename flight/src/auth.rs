//! Basic-then-bearer authentication, as pyarrow's `authenticate_basic_token` speaks it:
//! the Handshake carries `authorization: Basic base64(user:password)` and its response
//! returns `authorization: Bearer <token>`, which every later call carries.
//!
//! Each login gets a token of its own that expires (`ttl`); each user has roles that say
//! which calls it may make; a peer address that fails too many logins is refused for a
//! while.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

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

/// What a user may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Read ranks: ListFlights, GetFlightInfo, GetSchema, DoGet.
    Train,
    /// Push input: DoPut.
    Ingest,
    /// Operate the server: the `status` and `end_ingest` actions.
    Admin,
}

impl Role {
    const ALL: [Role; 3] = [Role::Train, Role::Ingest, Role::Admin];

    fn name(self) -> &'static str {
        match self {
            Role::Train => "train",
            Role::Ingest => "ingest",
            Role::Admin => "admin",
        }
    }

    fn bit(self) -> u8 {
        1 << self as u8
    }
}

/// Why a call or a login is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Denied {
    /// No valid credentials or token (UNAUTHENTICATED).
    #[error("{0}")]
    Unauthenticated(String),
    /// Valid token, but its user lacks the role (PERMISSION_DENIED).
    #[error("{0}")]
    PermissionDenied(String),
    /// Too many failed logins from this address (RESOURCE_EXHAUSTED).
    #[error("{0}")]
    Throttled(String),
}

/// Tokens alive at most; the oldest go first beyond.
const MAX_TOKENS: usize = 4096;
/// Failed logins a peer may make per [`FAILURE_WINDOW`] before it is refused.
pub const MAX_FAILURES: u32 = 5;
/// The window failed logins are counted over, and how long a peer is then refused.
pub const FAILURE_WINDOW: Duration = Duration::from_secs(60);
/// Peers whose failures are remembered at most.
const MAX_PEERS: usize = 4096;
/// How long a token lives unless told otherwise.
pub const DEFAULT_TTL: Duration = Duration::from_secs(24 * 3600);
/// The longest a token may live: a year (a longer one is cut to this; `--token-ttl`
/// refuses it).
pub const MAX_TTL: Duration = Duration::from_secs(365 * 24 * 3600);

struct User {
    name: String,
    password: String,
    roles: u8,
}

struct Issued {
    user: usize,
    expires: Instant,
}

/// The users, the tokens handed out to them, and the peers that failed to log in.
pub struct Auth {
    users: Vec<User>,
    ttl: Duration,
    tokens: Mutex<HashMap<String, Issued>>,
    failures: Mutex<HashMap<IpAddr, (u32, Instant)>>,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Auth({} users)", self.users.len())
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The largest token file read (a line per user).
const MAX_TOKEN_FILE_BYTES: u64 = 16 << 20;

impl Auth {
    /// Reads `user:password [roles]` lines, roles a comma-separated list of `train`,
    /// `ingest` and `admin` (all three when left out); blank lines and `#` comments are
    /// skipped. Passwords cannot hold whitespace.
    pub fn from_file(path: &std::path::Path) -> Result<Self, AuthError> {
        let err = |reason: String| AuthError {
            path: path.display().to_string(),
            reason,
        };
        let text = hydrant_operators::read_small_text(path, MAX_TOKEN_FILE_BYTES)
            .map_err(|e| err(e.to_string()))?;
        // A BOM (editors on Windows save one) would be part of the first user's name,
        // who then could never log in.
        let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
        let mut users = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let at = |reason: String| err(format!("line {}: {reason}", i + 1));
            let mut fields = line.split_whitespace();
            let (user, pass) = match fields.next().and_then(|f| f.split_once(':')) {
                Some((u, p)) if !u.is_empty() && !p.is_empty() => (u, p),
                _ => return Err(at("expected `user:password [roles]`".into())),
            };
            let roles = match fields.next() {
                None => Role::ALL.iter().map(|r| r.bit()).sum(),
                Some(list) => parse_roles(list).map_err(at)?,
            };
            if fields.next().is_some() {
                return Err(at(
                    "expected `user:password [roles]` (no whitespace in passwords)".into(),
                ));
            }
            // Two lines for one user: which password and roles hold would be a guess.
            if users.iter().any(|(u, _, _)| u == user) {
                return Err(at(format!(
                    "user `{}` is given twice",
                    hydrant_operators::quoted(user)
                )));
            }
            users.push((user.to_string(), pass.to_string(), roles));
        }
        if users.is_empty() {
            return Err(err("holds no `user:password` line".into()));
        }
        Ok(Self::with_roles(users))
    }

    /// Accepts `credentials`, each user with every role.
    pub fn new(credentials: Vec<(String, String)>) -> Self {
        let all = Role::ALL.iter().map(|r| r.bit()).sum();
        Self::with_roles(credentials.into_iter().map(|(u, p)| (u, p, all)).collect())
    }

    fn with_roles(users: Vec<(String, String, u8)>) -> Self {
        Auth {
            users: users
                .into_iter()
                .map(|(name, password, roles)| User {
                    name,
                    password,
                    roles,
                })
                .collect(),
            ttl: DEFAULT_TTL,
            tokens: Mutex::default(),
            failures: Mutex::default(),
        }
    }

    /// Tokens expire `ttl` after their login (default [`DEFAULT_TTL`], at most
    /// [`MAX_TTL`]).
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl.min(MAX_TTL);
        self
    }

    /// The bearer header value for a Handshake's `authorization` header, if it holds valid
    /// Basic credentials and `peer` has not failed too often.
    pub fn handshake(
        &self,
        authorization: Option<&str>,
        peer: Option<IpAddr>,
    ) -> Result<String, Denied> {
        let now = Instant::now();
        if let Some(peer) = peer
            && let Some(&(n, since)) = lock(&self.failures).get(&peer)
            && n >= MAX_FAILURES
            && now.duration_since(since) < FAILURE_WINDOW
        {
            let wait = FAILURE_WINDOW - now.duration_since(since);
            return Err(Denied::Throttled(format!(
                "too many failed logins from {peer}; retry in {} s",
                wait.as_secs() + 1
            )));
        }
        let Some(user) = self.verify(authorization) else {
            if let Some(peer) = peer {
                self.failed(peer, now);
            }
            return Err(Denied::Unauthenticated("wrong user or password".into()));
        };
        if let Some(peer) = peer {
            lock(&self.failures).remove(&peer);
        }
        let mut rng = rand::rng();
        let token: String = (0..32)
            .map(|_| format!("{:x}", rng.random_range(0..16u8)))
            .collect();
        let mut tokens = lock(&self.tokens);
        tokens.retain(|_, t| t.expires > now);
        if tokens.len() >= MAX_TOKENS
            && let Some(oldest) = tokens
                .iter()
                .min_by_key(|(_, t)| t.expires)
                .map(|(k, _)| k.clone())
        {
            tokens.remove(&oldest);
        }
        tokens.insert(
            token.clone(),
            Issued {
                user,
                expires: now + self.ttl,
            },
        );
        Ok(format!("Bearer {token}"))
    }

    /// The user whose Basic credentials these are. Every entry is compared, in constant
    /// time, so timing says nothing of which failed.
    fn verify(&self, authorization: Option<&str>) -> Option<usize> {
        let encoded = authorization?.strip_prefix("Basic ")?;
        let decoded = STANDARD.decode(encoded.trim()).ok()?;
        let (user, pass) = std::str::from_utf8(&decoded).ok()?.split_once(':')?;
        let mut found = None;
        for (i, u) in self.users.iter().enumerate() {
            if constant_time_eq(u.name.as_bytes(), user.as_bytes())
                & constant_time_eq(u.password.as_bytes(), pass.as_bytes())
            {
                found = Some(i);
            }
        }
        found
    }

    fn failed(&self, peer: IpAddr, now: Instant) {
        let mut failures = lock(&self.failures);
        if failures.len() >= MAX_PEERS {
            failures.retain(|_, (_, since)| now.duration_since(*since) < FAILURE_WINDOW);
        }
        if failures.len() >= MAX_PEERS {
            return; // under a spread-out attack, the window's first peers stay counted
        }
        let entry = failures.entry(peer).or_insert((0, now));
        if now.duration_since(entry.1) >= FAILURE_WINDOW {
            *entry = (0, now);
        }
        entry.0 += 1;
        if entry.0 == MAX_FAILURES {
            entry.1 = now; // refused for a whole window from the last failure
        }
    }

    /// Whether a call's `authorization` header carries a live token whose user has `role`
    /// (any live token, for `None`: calls every user may make).
    pub fn check(&self, authorization: Option<&str>, role: Option<Role>) -> Result<(), Denied> {
        let token = authorization
            .and_then(|a| a.strip_prefix("Bearer "))
            .map(str::trim)
            .ok_or_else(|| {
                Denied::Unauthenticated("missing or wrong bearer token (handshake first)".into())
            })?;
        let tokens = lock(&self.tokens);
        // A map lookup, not a constant-time comparison: the token is 128 random bits and
        // the lookup hashes it first, so timing reveals nothing usable about other tokens.
        let issued = tokens.get(token).ok_or_else(|| {
            Denied::Unauthenticated("missing or wrong bearer token (handshake first)".into())
        })?;
        if issued.expires <= Instant::now() {
            return Err(Denied::Unauthenticated(
                "bearer token expired (handshake again)".into(),
            ));
        }
        let user = &self.users[issued.user];
        if let Some(role) = role.filter(|r| user.roles & r.bit() == 0) {
            return Err(Denied::PermissionDenied(format!(
                "user `{}` lacks the `{}` role",
                user.name,
                role.name()
            )));
        }
        Ok(())
    }
}

/// The roles of a comma-separated list. What is not a role is not quoted: it may be the
/// rest of a password with a space in it, and the error goes to the log.
fn parse_roles(list: &str) -> Result<u8, String> {
    let mut roles = 0;
    for name in list.split(',') {
        let role = Role::ALL
            .into_iter()
            .find(|r| r.name() == name)
            .ok_or_else(|| {
                "the field after `user:password` is not a comma-separated list of roles \
                 (train, ingest, admin); passwords cannot hold whitespace"
                    .to_string()
            })?;
        roles |= role.bit();
    }
    Ok(roles)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn basic(user_pass: &str) -> String {
        format!("Basic {}", STANDARD.encode(user_pass))
    }

    #[test]
    fn basic_then_bearer_per_login() {
        let auth = Auth::new(vec![("alice".into(), "s3cret".into())]);
        let bearer = auth.handshake(Some(&basic("alice:s3cret")), None).unwrap();
        let again = auth.handshake(Some(&basic("alice:s3cret")), None).unwrap();
        assert_ne!(bearer, again, "each login gets its own token");
        assert!(auth.check(Some(&bearer), Some(Role::Train)).is_ok());
        assert!(auth.check(Some(&again), Some(Role::Admin)).is_ok());
        let unauth = |h: Option<&str>| {
            matches!(
                auth.check(h, Some(Role::Train)),
                Err(Denied::Unauthenticated(_))
            )
        };
        assert!(unauth(Some("Bearer nope")) && unauth(None) && unauth(Some("Basic x")));
        for wrong in [basic("alice:guess"), "Basic !!!".into()] {
            assert!(auth.handshake(Some(&wrong), None).is_err());
        }
        assert!(auth.handshake(None, None).is_err());
    }

    #[test]
    fn tokens_expire_and_roles_are_enforced() {
        let auth = Auth::with_roles(vec![("t".into(), "p".into(), Role::Train.bit())])
            .with_ttl(Duration::from_millis(50));
        let bearer = auth.handshake(Some(&basic("t:p")), None).unwrap();
        assert!(auth.check(Some(&bearer), Some(Role::Train)).is_ok());
        let e = auth.check(Some(&bearer), Some(Role::Ingest)).unwrap_err();
        assert_eq!(
            e,
            Denied::PermissionDenied("user `t` lacks the `ingest` role".into())
        );
        // A call any user may make needs a live token only.
        assert!(auth.check(Some(&bearer), None).is_ok());
        assert!(auth.check(Some("Bearer nope"), None).is_err());
        std::thread::sleep(Duration::from_millis(60));
        let e = auth.check(Some(&bearer), Some(Role::Train)).unwrap_err();
        assert!(e.to_string().contains("expired"), "{e}");
    }

    /// A lifetime past what an `Instant` can add (`u64::MAX` seconds) is cut to a year:
    /// logins work, where each panicked before.
    #[test]
    fn a_lifetime_too_long_is_cut_to_a_year() {
        let auth = Auth::new(vec![("alice".into(), "s3cret".into())])
            .with_ttl(Duration::from_secs(u64::MAX));
        let bearer = auth.handshake(Some(&basic("alice:s3cret")), None).unwrap();
        assert!(auth.check(Some(&bearer), Some(Role::Train)).is_ok());
        assert_eq!(auth.ttl, MAX_TTL);
    }

    #[test]
    fn a_peer_that_fails_too_often_is_refused_even_with_the_right_password() {
        let auth = Auth::new(vec![("alice".into(), "s3cret".into())]);
        let (peer, other) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        for _ in 0..MAX_FAILURES {
            let e = auth.handshake(Some(&basic("alice:guess")), Some(peer));
            assert!(matches!(e, Err(Denied::Unauthenticated(_))));
        }
        let e = auth.handshake(Some(&basic("alice:s3cret")), Some(peer));
        assert!(matches!(e, Err(Denied::Throttled(_))), "{e:?}");
        assert!(
            auth.handshake(Some(&basic("alice:s3cret")), Some(other))
                .is_ok()
        );
    }

    #[test]
    fn token_files_are_checked() {
        let dir = std::env::temp_dir().join(format!("hydrant-auth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("t");
        std::fs::write(&f, "# users\nalice:s3cret\nbob:pw train,ingest\n").unwrap();
        let auth = Auth::from_file(&f).unwrap();
        let bob = auth.handshake(Some(&basic("bob:pw")), None).unwrap();
        assert!(auth.check(Some(&bob), Some(Role::Ingest)).is_ok());
        assert!(auth.check(Some(&bob), Some(Role::Admin)).is_err());
        for (text, needle) in [
            ("alice\n", "line 1"),
            ("a:b train,root\n", "not a comma-separated list of roles"),
            // A password with a space: the rest of it is not repeated in the error.
            (
                "alice:correct horse battery\n",
                "passwords cannot hold whitespace",
            ),
            ("a:b train extra\n", "no whitespace in passwords"),
            ("\n", "no `user:password` line"),
            ("u:p\nv:w\nu:q ingest\n", "line 3: user `u` is given twice"),
        ] {
            std::fs::write(&f, text).unwrap();
            let e = Auth::from_file(&f).unwrap_err().to_string();
            assert!(e.contains(needle), "{text:?}: {e}");
            assert!(!e.contains("horse") && !e.contains("root"), "{e}");
        }
        // Saved with a BOM: the first user is `alice`, not "\u{feff}alice".
        std::fs::write(&f, "\u{feff}alice:s3cret\n").unwrap();
        let auth = Auth::from_file(&f).unwrap();
        assert!(auth.handshake(Some(&basic("alice:s3cret")), None).is_ok());
    }
}
