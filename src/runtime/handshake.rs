//! How two processes of a cluster greet on a new connection, and prove to each other that
//! they hold the cluster's secret.
//!
//! The dialer sends what the connection is for ([`HELLO`] or [`HELLO_BEAT`]), its index
//! and a fresh nonce; the acceptor answers with a nonce of its own and an HMAC-SHA256 tag
//! over both nonces, both indexes and the connection's purpose; the dialer checks it and
//! answers with its own tag over the same. Each side thus shows it holds the secret
//! without sending it, and no answer can be replayed on another connection. Without a
//! secret the tags are keyed with nothing: the exchange is the same, and proves only that
//! both sides run this protocol. It authenticates the joining, not the bytes that follow:
//! a cluster's ports still belong on a network that only its processes reach.
//!
//! The acceptor's side never blocks ([`Greeting::poll`]): a connection that says nothing
//! (a port scanner, a stranger) is dropped after [`GREETING_TIMEOUT`] without holding up
//! the others.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};

use crate::error::{Error, Result};

/// Opens the connection timely's network uses.
pub(super) const HELLO: &[u8; 8] = b"hydrant2";
/// Opens the connection the peers' heartbeats use (`heartbeat.rs`).
pub(super) const HELLO_BEAT: &[u8; 8] = b"hydrantC";

/// How long an accepted connection has to greet and prove itself (peers do at once).
const GREETING_TIMEOUT: Duration = Duration::from_secs(1);
/// How long a dialer waits for the acceptor's answer.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(2);

/// What is said of a peer whose answer or proof was wrong.
pub(super) const UNPROVED: &str = "it did not prove the cluster's secret (started with \
     another --cluster-secret-file, or none where another process has one, or the other \
     way round)";

const NONCE: usize = 16;
const TAG: usize = 32;
/// Purpose, dialer's index, dialer's nonce.
const GREETING: usize = 8 + 8 + NONCE;
/// Acceptor's nonce and tag.
const ANSWER: usize = NONCE + TAG;

/// The fewest bytes a cluster secret may have.
const SHORTEST_SECRET: usize = 16;

/// A cluster's shared secret (`--cluster-secret-file`): the processes prove to each other
/// that they hold it when they join, so that a stranger on a cluster port cannot pose as
/// a peer. Never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterSecret(Arc<[u8]>);

impl ClusterSecret {
    /// A secret of `bytes`, at least 16 of them.
    pub fn new(bytes: &[u8]) -> Result<Self> {
        if bytes.len() < SHORTEST_SECRET {
            return Err(Error::Usage(format!(
                "a cluster secret has {} bytes; give at least {SHORTEST_SECRET} (for \
                 example `openssl rand -hex 32`)",
                bytes.len()
            )));
        }
        Ok(ClusterSecret(bytes.into()))
    }

    /// The secret in the file at `path`, without the whitespace that ends it.
    pub fn from_file(path: &Path) -> Result<Self> {
        let named =
            |e: String| Error::Usage(format!("cluster secret file {}: {e}", path.display()));
        let bytes =
            hydrant_operators::read_small_file(path, 64 << 10).map_err(|e| named(e.to_string()))?;
        let end = bytes.trim_ascii_end().len();
        ClusterSecret::new(&bytes[..end]).map_err(|e| named(e.to_string()))
    }

    fn key(&self) -> hmac::Key {
        hmac::Key::new(hmac::HMAC_SHA256, &self.0)
    }
}

impl std::fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterSecret(..)")
    }
}

/// The key both sides sign with: the secret's, or none.
pub(super) fn key(secret: Option<&ClusterSecret>) -> hmac::Key {
    secret.map_or_else(
        || hmac::Key::new(hmac::HMAC_SHA256, &[]),
        ClusterSecret::key,
    )
}

/// What a tag covers: who signs it (`b'A'` the acceptor, `b'D'` the dialer), the
/// connection's purpose, who dials whom, and both nonces (the dialer's first).
fn covered(
    by: u8,
    hello: &[u8; 8],
    (dialer, acceptor): (usize, usize),
    nonces: [&[u8]; 2],
) -> Vec<u8> {
    let mut data = Vec::with_capacity(1 + 8 + 16 + 2 * NONCE);
    data.push(by);
    data.extend_from_slice(hello);
    data.extend_from_slice(&(dialer as u64).to_le_bytes());
    data.extend_from_slice(&(acceptor as u64).to_le_bytes());
    data.extend_from_slice(nonces[0]);
    data.extend_from_slice(nonces[1]);
    data
}

fn nonce() -> Option<[u8; NONCE]> {
    let mut n = [0u8; NONCE];
    SystemRandom::new().fill(&mut n).ok()?;
    Some(n)
}

/// Why a dial did not give a connection.
pub(super) enum NotJoined {
    /// Nothing to talk to yet (the peer has not started listening), or no answer: try
    /// again.
    NotYet,
    /// An answer that does not prove this cluster's secret: the peer was started with
    /// another (or none), or something else listens at its address.
    Refused(String),
}

/// A connection to process `to` at `address`, greeted as process `me` for `hello`'s
/// purpose, once both sides have proved they hold the secret of `key`.
pub(super) fn dial(
    address: &str,
    hello: &'static [u8; 8],
    (me, to): (usize, usize),
    key: &hmac::Key,
) -> std::result::Result<TcpStream, NotJoined> {
    let mut stream = TcpStream::connect(address).map_err(|_| NotJoined::NotYet)?;
    let mine = nonce().ok_or(NotJoined::NotYet)?;
    let mut greeting = Vec::with_capacity(GREETING);
    greeting.extend_from_slice(hello);
    greeting.extend_from_slice(&(me as u64).to_le_bytes());
    greeting.extend_from_slice(&mine);
    let mut answer = [0u8; ANSWER];
    let answered = stream.set_nodelay(true).is_ok()
        && stream.set_read_timeout(Some(ANSWER_TIMEOUT)).is_ok()
        && stream.write_all(&greeting).is_ok()
        && stream.read_exact(&mut answer).is_ok();
    if !answered {
        return Err(NotJoined::NotYet);
    }
    let (theirs, tag) = answer.split_at(NONCE);
    let theirs_covered = covered(b'A', hello, (me, to), [&mine, theirs]);
    if hmac::verify(key, &theirs_covered, tag).is_err() {
        return Err(NotJoined::Refused(UNPROVED.into()));
    }
    let proof = hmac::sign(key, &covered(b'D', hello, (me, to), [&mine, theirs]));
    let ready = stream.write_all(proof.as_ref()).is_ok() && stream.set_read_timeout(None).is_ok();
    if !ready {
        return Err(NotJoined::NotYet);
    }
    Ok(stream)
}

/// An accepted connection being greeted (without blocking).
pub(super) struct Greeting {
    stream: TcpStream,
    got: Vec<u8>,
    since: Instant,
    /// Once its greeting is read and answered.
    answered: Option<Answered>,
}

/// A greeting read and answered: what the connection is for, who dials, and both nonces.
struct Answered {
    hello: &'static [u8; 8],
    dialer: usize,
    theirs: [u8; NONCE],
    mine: [u8; NONCE],
}

/// What a greeting came to.
pub(super) enum Greeted {
    /// Not all of it yet.
    Pending(Greeting),
    /// A peer that proved the secret: what the connection is for ([`HELLO`] or
    /// [`HELLO_BEAT`]) and the index it comes from (checked by the caller).
    Peer(&'static [u8; 8], usize, TcpStream),
    /// A greeting as this process, whose proof was wrong.
    Unproved(usize),
    /// Anything else: closed, silent past [`GREETING_TIMEOUT`], or not a greeting.
    Stranger,
}

impl Greeting {
    /// `stream`, non-blocking, accepted by process `me`.
    pub fn new(stream: TcpStream) -> Self {
        Greeting {
            stream,
            got: Vec::with_capacity(GREETING),
            since: Instant::now(),
            answered: None,
        }
    }

    /// Reads what has arrived of the greeting or of the proof, answers a whole greeting,
    /// and checks a whole proof, as process `me` holding `key`.
    pub fn poll(mut self, me: usize, key: &hmac::Key) -> Greeted {
        let want = if self.answered.is_some() {
            TAG
        } else {
            GREETING
        };
        let mut buf = [0u8; GREETING];
        match (&self.stream).read(&mut buf[..want - self.got.len()]) {
            Ok(0) => return Greeted::Stranger,
            Ok(k) => self.got.extend_from_slice(&buf[..k]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {}
            Err(_) => return Greeted::Stranger,
        }
        if self.got.len() < want {
            return if self.since.elapsed() < GREETING_TIMEOUT {
                Greeted::Pending(self)
            } else {
                Greeted::Stranger
            };
        }
        match self.answered {
            None => self.answer(me, key),
            Some(Answered {
                hello,
                dialer,
                theirs,
                mine,
            }) => {
                let data = covered(b'D', hello, (dialer, me), [&theirs, &mine]);
                let proved = hmac::verify(key, &data, &self.got).is_ok();
                if !proved {
                    return Greeted::Unproved(dialer);
                }
                let ready = self.stream.set_nonblocking(false).is_ok()
                    && self.stream.set_nodelay(true).is_ok();
                if ready {
                    Greeted::Peer(hello, dialer, self.stream)
                } else {
                    Greeted::Stranger
                }
            }
        }
    }

    /// Answers a whole greeting with a nonce and this side's tag.
    fn answer(mut self, me: usize, key: &hmac::Key) -> Greeted {
        let Some(hello) = [HELLO, HELLO_BEAT]
            .into_iter()
            .find(|k| &self.got[..8] == k.as_slice())
        else {
            return Greeted::Stranger;
        };
        let dialer = u64::from_le_bytes(self.got[8..16].try_into().unwrap_or_default()) as usize;
        let mut theirs = [0u8; NONCE];
        theirs.copy_from_slice(&self.got[16..GREETING]);
        let Some(mine) = nonce() else {
            return Greeted::Stranger;
        };
        let tag = hmac::sign(key, &covered(b'A', hello, (dialer, me), [&theirs, &mine]));
        let mut answer = [0u8; ANSWER];
        answer[..NONCE].copy_from_slice(&mine);
        answer[NONCE..].copy_from_slice(tag.as_ref());
        // A fresh connection's send buffer takes 48 bytes at once; one that does not is
        // not worth waiting for.
        if !matches!((&self.stream).write(&answer), Ok(n) if n == ANSWER) {
            return Greeted::Stranger;
        }
        self.got.clear();
        self.answered = Some(Answered {
            hello,
            dialer,
            theirs,
            mine,
        });
        Greeted::Pending(self)
    }
}
