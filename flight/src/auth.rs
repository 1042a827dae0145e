//! Basic-then-bearer authentication, as pyarrow's `authenticate_basic_token` speaks it:
//! the Handshake carries `authorization: Basic base64(user:password)` and its response
//! returns `authorization: Bearer <token>`, which every later call carries.
//!
//! Each login gets a token of its own that expires (`ttl`); each user has roles that say
//! which calls it may make; a peer address that fails too many logins is refused for a
//! while.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use constant_time_eq::constant_time_eq;
use rand::RngExt;

mod failures;
use failures::{Counted, Failures, MAX_PEERS, counted_as};

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

/// Tokens one user holds at most: past it, a login lets go of that user's oldest token,
/// so that no user can push another's tokens out by logging in over and over.
const MAX_USER_TOKENS: usize = 4096;
/// Tokens alive at most, whoever holds them: past it, a login lets go of the oldest token
/// of the user that holds the most.
const MAX_TOKENS: usize = 16 * MAX_USER_TOKENS;
/// Failed logins a peer may make per [`FAILURE_WINDOW`] before it is refused.
pub const MAX_FAILURES: u32 = 5;
/// The window failed logins are counted over, and how long a peer is then refused.
pub const FAILURE_WINDOW: Duration = Duration::from_secs(60);
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
    tokens: Mutex<Tokens>,
    failures: Mutex<Failures>,
}

/// The tokens handed out: by token, and each user's in the order they were issued, which
/// is the order they expire in (every token lives the same `ttl`), so that a login keeps
/// them in bounds without a scan.
#[derive(Default)]
struct Tokens {
    by_token: HashMap<String, Issued>,
    by_user: HashMap<usize, VecDeque<String>>,
}

impl Tokens {
    /// Lets go of `user`'s oldest token.
    fn drop_oldest(&mut self, user: usize) {
        if let Some(queue) = self.by_user.get_mut(&user) {
            if let Some(token) = queue.pop_front() {
                self.by_token.remove(&token);
            }
            if queue.is_empty() {
                self.by_user.remove(&user);
            }
        }
    }

    /// Lets go of `user`'s tokens that have expired by `now`.
    fn drop_expired(&mut self, user: usize, now: Instant) {
        while let Some(oldest) = self.by_user.get(&user).and_then(VecDeque::front)
            && self.by_token.get(oldest).is_none_or(|t| t.expires <= now)
        {
            self.drop_oldest(user);
        }
    }

    /// Hands `token` to `user` until `expires`, within [`MAX_USER_TOKENS`] for the user
    /// (its own oldest goes) and [`MAX_TOKENS`] in all (expired ones go, then the oldest
    /// of a user holding the most).
    fn issue(&mut self, token: String, user: usize, expires: Instant, now: Instant) {
        self.drop_expired(user, now);
        let held = self.by_user.get(&user).map_or(0, VecDeque::len);
        if held >= MAX_USER_TOKENS {
            self.drop_oldest(user);
        } else if self.by_token.len() >= MAX_TOKENS {
            let users: Vec<usize> = self.by_user.keys().copied().collect();
            for u in users {
                self.drop_expired(u, now);
            }
            let most = self.by_user.iter().max_by_key(|(_, q)| q.len());
            if self.by_token.len() >= MAX_TOKENS
                && let Some(most) = most.map(|(&u, _)| u)
            {
                self.drop_oldest(most);
            }
        }
        self.by_user
            .entry(user)
            .or_default()
            .push_back(token.clone());
        self.by_token.insert(token, Issued { user, expires });
    }
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
        let mut names = std::collections::HashSet::new();
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
            if !names.insert(user) {
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

    /// Who may do what, without a secret, for servers that must agree (the processes of
    /// one cluster): the number of users, a digest of their names and roles, and how long
    /// a token lives. Passwords are not in it; they never leave the process.
    pub fn summary(&self) -> String {
        use std::hash::{Hash, Hasher};
        let mut users: Vec<(&str, u8)> = self.users.iter().map(|u| (&*u.name, u.roles)).collect();
        users.sort_unstable();
        // `DefaultHasher::new()` hashes alike in every process of a build.
        let mut digest = std::collections::hash_map::DefaultHasher::new();
        users.hash(&mut digest);
        format!(
            "{} users and their roles ({:016x}), tokens living {} s",
            users.len(),
            digest.finish(),
            self.ttl.as_secs()
        )
    }

    /// The bearer header value for a Handshake's `authorization` header, if it holds valid
    /// Basic credentials and `peer` has not failed too often.
    pub fn handshake(
        &self,
        authorization: Option<&str>,
        peer: Option<IpAddr>,
    ) -> Result<String, Denied> {
        let now = Instant::now();
        let counted = match peer {
            Some(peer) => Some(self.attempt(counted_as(peer), now)?),
            None => None,
        };
        let Some(user) = self.verify(authorization) else {
            return Err(Denied::Unauthenticated("wrong user or password".into()));
        };
        if let Some(counted) = counted {
            lock(&self.failures).take_back(counted);
        }
        // A login does not clear its address's failures: they may have been guesses at
        // another user's password, made between logins of one's own.
        let mut rng = rand::rng();
        let token: String = (0..32)
            .map(|_| format!("{:x}", rng.random_range(0..16u8)))
            .collect();
        let bearer = format!("Bearer {token}");
        lock(&self.tokens).issue(token, user, now + self.ttl, now);
        Ok(bearer)
    }

    /// The user whose Basic credentials these are. Every entry is compared, in constant
    /// time, so timing says nothing of which failed.
    fn verify(&self, authorization: Option<&str>) -> Option<usize> {
        let encoded = scheme(authorization?, "Basic")?;
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

    /// Refuses `peer` if it failed too often; otherwise counts this login as failed until
    /// it succeeds, under the lock the check took, so that logins sent together cannot
    /// each pass the check before any of them is counted.
    fn attempt(&self, peer: IpAddr, now: Instant) -> Result<Counted, Denied> {
        let mut failures = lock(&self.failures);
        if let Some(((n, since), own)) = failures.get(peer) {
            let past = now.saturating_duration_since(since);
            if n >= MAX_FAILURES && past < FAILURE_WINDOW {
                let wait = FAILURE_WINDOW - past;
                let from = match own {
                    true => format!("from {peer}"),
                    false => "from too many addresses".into(),
                };
                return Err(Denied::Throttled(format!(
                    "too many failed logins {from}; retry in {} s",
                    wait.as_secs() + 1
                )));
            }
        }
        if failures.by_peer.len() >= MAX_PEERS {
            let by_peer = &mut failures.by_peer;
            by_peer.retain(|_, (_, since)| now.saturating_duration_since(*since) < FAILURE_WINDOW);
        }
        let counted = failures.place(peer);
        let entry = failures.of(counted, now);
        if now.saturating_duration_since(entry.1) >= FAILURE_WINDOW {
            *entry = (0, now);
        }
        entry.0 += 1;
        if entry.0 == MAX_FAILURES {
            entry.1 = now; // refused for a whole window from the last failure
        }
        Ok(counted)
    }

    /// Whether a call's `authorization` header carries a live token whose user has `role`
    /// (any live token, for `None`: calls every user may make).
    pub fn check(&self, authorization: Option<&str>, role: Option<Role>) -> Result<(), Denied> {
        let token = authorization
            .and_then(|a| scheme(a, "Bearer"))
            .map(str::trim)
            .ok_or_else(|| {
                Denied::Unauthenticated("missing bearer token (handshake first)".into())
            })?;
        let tokens = lock(&self.tokens);
        // A map lookup, not a constant-time comparison: the token is 128 random bits and
        // the lookup hashes it first, so timing reveals nothing usable about other tokens.
        let issued = tokens.by_token.get(token).ok_or_else(|| {
            Denied::Unauthenticated(format!(
                "unknown bearer token (handshake again: a token ends when the server \
                 restarts, when its user logs in {MAX_USER_TOKENS} times after it, and \
                 when the server holds {MAX_TOKENS} tokens)"
            ))
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

/// What follows the scheme `name` in an `authorization` header value: the scheme's case
/// does not matter (HTTP's rule), and one space ends it.
fn scheme<'a>(value: &'a str, name: &str) -> Option<&'a str> {
    let (given, rest) = value.split_once(' ')?;
    given.eq_ignore_ascii_case(name).then_some(rest)
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

    /// Servers agree on users and roles, in any order, whatever the passwords; another
    /// user, role or token life differs, and no password shows.
    #[test]
    fn a_summary_names_users_and_roles_and_no_secret() {
        let roles = |list: &[(&str, &str, u8)]| {
            Auth::with_roles(
                list.iter()
                    .map(|&(u, p, r)| (u.to_string(), p.to_string(), r))
                    .collect(),
            )
            .summary()
        };
        let one = roles(&[("alice", "s3cret", 1), ("bob", "pw", 6)]);
        assert_eq!(one, roles(&[("bob", "other", 6), ("alice", "s3cret", 1)]));
        assert!(one.starts_with("2 users and their roles"), "{one}");
        assert!(!one.contains("s3cret") && !one.contains("alice"), "{one}");
        for other in [
            roles(&[("alice", "s3cret", 1), ("bob", "pw", 7)]),
            roles(&[("alice", "s3cret", 1), ("carol", "pw", 6)]),
            roles(&[("alice", "s3cret", 1)]),
        ] {
            assert_ne!(one, other);
        }
        let auth = Auth::new(vec![("alice".into(), "x".into())]);
        let (short, long) = (
            auth.summary(),
            auth.with_ttl(Duration::from_secs(60)).summary(),
        );
        assert_ne!(short, long);
        assert!(long.ends_with("tokens living 60 s"), "{long}");
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
        // Schemes are case-insensitive, as HTTP's are.
        let lower = basic("alice:s3cret").replacen("Basic", "basic", 1);
        let bearer = auth.handshake(Some(&lower), None).unwrap();
        let upper = bearer.replacen("Bearer", "BEARER", 1);
        assert!(auth.check(Some(&upper), Some(Role::Train)).is_ok());
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

    /// Found by a hostile run: logging in as oneself between guesses at another user's
    /// password cleared the address's failures, so the guessing was never throttled.
    #[test]
    fn a_login_of_ones_own_does_not_clear_the_failures_before_it() {
        let auth = Auth::new(vec![
            ("mallory".into(), "own".into()),
            ("root".into(), "hunter2".into()),
        ]);
        let peer = Some("10.0.0.1".parse().unwrap());
        for k in 0..MAX_FAILURES {
            let e = auth.handshake(Some(&basic("root:guess")), peer);
            assert!(
                matches!(e, Err(Denied::Unauthenticated(_))),
                "guess {k}: {e:?}"
            );
            if k + 1 < MAX_FAILURES {
                assert!(auth.handshake(Some(&basic("mallory:own")), peer).is_ok());
            }
        }
        let e = auth.handshake(Some(&basic("root:hunter2")), peer);
        assert!(matches!(e, Err(Denied::Throttled(_))), "{e:?}");
    }

    /// Guesses sent together could each pass the throttle's check before any of them was
    /// counted as failed (the check and the count took the lock apart). Now at most
    /// [`MAX_FAILURES`] of them are answered.
    #[test]
    fn guesses_sent_together_are_throttled_as_if_one_after_another() {
        // Many users make each check of a password long enough for the guesses to overlap.
        let users = (0..20_000).map(|i| (format!("u{i}"), "pw".to_string()));
        let auth = Auth::new(users.collect());
        let peer = Some("10.0.0.1".parse().unwrap());
        let start = std::sync::Barrier::new(16);
        let answered = std::sync::atomic::AtomicU32::new(0);
        std::thread::scope(|s| {
            for _ in 0..16 {
                s.spawn(|| {
                    start.wait();
                    for _ in 0..4 {
                        let e = auth.handshake(Some(&basic("u1:guess")), peer);
                        if matches!(e, Err(Denied::Unauthenticated(_))) {
                            answered.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        assert_eq!(answered.into_inner(), MAX_FAILURES);
        // And logins that succeed take back what they were counted: a peer's good logins
        // never throttle it.
        let good: IpAddr = "10.0.0.2".parse().unwrap();
        for _ in 0..3 * MAX_FAILURES {
            assert!(auth.handshake(Some(&basic("u2:pw")), Some(good)).is_ok());
        }
        assert!(lock(&auth.failures).get(good).is_none());
    }

    /// Found by a hostile run: one user logging in 4,096 times pushed every other user's
    /// tokens out. A user's logins now let go of that user's own oldest tokens only.
    #[test]
    fn one_users_logins_do_not_end_another_users_tokens() {
        let auth = Auth::new(vec![
            ("alice".into(), "a".into()),
            ("mallory".into(), "m".into()),
        ]);
        let alice = auth.handshake(Some(&basic("alice:a")), None).unwrap();
        let first = auth.handshake(Some(&basic("mallory:m")), None).unwrap();
        for _ in 0..MAX_USER_TOKENS + 10 {
            auth.handshake(Some(&basic("mallory:m")), None).unwrap();
        }
        assert!(auth.check(Some(&alice), Some(Role::Train)).is_ok());
        let e = auth.check(Some(&first), None).unwrap_err();
        assert!(e.to_string().contains("unknown bearer token"), "{e}");
        let held = lock(&auth.tokens).by_token.len();
        assert_eq!(held, MAX_USER_TOKENS + 1, "mallory's and alice's");
    }

    /// Past [`MAX_TOKENS`] in all, a login lets go of one token of a user holding the
    /// most, its oldest, and of no one else's.
    #[test]
    fn past_the_servers_tokens_a_user_holding_the_most_lets_go_of_its_oldest() {
        let users = MAX_TOKENS / MAX_USER_TOKENS;
        let names: Vec<String> = (0..=users).map(|u| format!("u{u}")).collect();
        let auth = Auth::new(names.iter().map(|n| (n.clone(), "p".into())).collect());
        let login = |u: usize| {
            let basic = basic(&format!("{}:p", names[u]));
            auth.handshake(Some(&basic), None).unwrap()
        };
        let firsts: Vec<String> = (1..=users).map(login).collect();
        for u in 1..=users {
            for _ in 1..MAX_USER_TOKENS {
                login(u);
            }
        }
        assert_eq!(lock(&auth.tokens).by_token.len(), MAX_TOKENS);
        let alice = login(0);
        assert!(auth.check(Some(&alice), None).is_ok());
        assert_eq!(lock(&auth.tokens).by_token.len(), MAX_TOKENS);
        let lost = firsts
            .iter()
            .filter(|t| auth.check(Some(t), None).is_err())
            .count();
        assert_eq!(lost, 1, "one user's oldest token went, no one else's");
    }

    /// Logs in as `user_pass` once from each of [`MAX_PEERS`] IPv4 addresses; whether
    /// each was let in.
    fn from_every_peer(auth: &Auth, user_pass: &str) -> Vec<bool> {
        (0..MAX_PEERS as u32)
            .map(|k| {
                let peer = IpAddr::V4(std::net::Ipv4Addr::from_bits(0x0a00_0000 + k));
                auth.handshake(Some(&basic(user_pass)), Some(peer)).is_ok()
            })
            .collect()
    }

    /// Found by a hostile run: once 4,096 addresses had failed, failures from any other
    /// were not counted at all. They are now counted together; and an IPv6 peer's failures
    /// count for its /64.
    #[test]
    fn failures_from_more_addresses_than_are_remembered_are_still_counted() {
        let auth = Auth::new(vec![("root".into(), "hunter2".into())]);
        assert!(from_every_peer(&auth, "root:guess").iter().all(|ok| !ok));
        let fresh = |k: u32| Some(IpAddr::V4(std::net::Ipv4Addr::from_bits(0x0b00_0000 + k)));
        for k in 0..MAX_FAILURES {
            let e = auth.handshake(Some(&basic("root:guess")), fresh(k));
            assert!(matches!(e, Err(Denied::Unauthenticated(_))), "{e:?}");
        }
        let e = auth.handshake(Some(&basic("root:hunter2")), fresh(99));
        assert!(
            matches!(&e, Err(Denied::Throttled(m)) if m.contains("too many addresses")),
            "{e:?}"
        );

        let auth = Auth::new(vec![("root".into(), "hunter2".into())]);
        for k in 0..MAX_FAILURES {
            let peer = format!("2001:db8:1:2::{:x}", k + 1).parse().unwrap();
            assert!(
                auth.handshake(Some(&basic("root:guess")), Some(peer))
                    .is_err()
            );
        }
        let same_64 = Some("2001:db8:1:2:ffff::9".parse().unwrap());
        let e = auth.handshake(Some(&basic("root:hunter2")), same_64);
        assert!(matches!(e, Err(Denied::Throttled(_))), "{e:?}");
        let other_64 = Some("2001:db8:1:3::1".parse().unwrap());
        assert!(
            auth.handshake(Some(&basic("root:hunter2")), other_64)
                .is_ok()
        );

        // Logins that succeed take no place in the table: past as many of them, a new
        // address's failures are still its own.
        let auth = Auth::new(vec![("root".into(), "hunter2".into())]);
        assert!(from_every_peer(&auth, "root:hunter2").iter().all(|&ok| ok));
        for _ in 0..MAX_FAILURES {
            assert!(
                auth.handshake(Some(&basic("root:guess")), fresh(1))
                    .is_err()
            );
        }
        let e = auth.handshake(Some(&basic("root:hunter2")), fresh(1));
        assert!(
            matches!(&e, Err(Denied::Throttled(m)) if m.contains("from 11.0.0.1")),
            "{e:?}"
        );
    }

    #[test]
    fn token_files_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("t");
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
