//! How two processes of a cluster greet on a new connection, and prove to each other that
//! they hold the cluster's secret.
//!
//! The dialer sends what the connection is for ([`HELLO`] or [`HELLO_BEAT`]), its seat
//! (its index and the cluster's size as it was told it, [`seat`]) and a fresh nonce; the
//! acceptor answers with the same purpose, its own seat, a nonce of its own and an
//! HMAC-SHA256 tag over both nonces, both seats and the purpose; the
//! dialer checks it and answers with its own tag over the same (or with a refusal, so
//! that the acceptor can name it too); the acceptor checks that and welcomes it with one
//! byte. Each side thus shows it holds the secret without sending it, and no answer can
//! be replayed on another connection. Two processes started with different `--processes`
//! learn it here, at once, and both say so (the acceptor welcomes no such peer), rather
//! than wait for a join that cannot complete. Without a
//! secret the tags are keyed with nothing: the exchange is the same, and proves only that
//! both sides run this protocol. It authenticates the joining, not the bytes that follow:
//! a cluster's ports still belong on a network that only its processes reach.
//!
//! A process that fails before it joins says so on a connection of a third purpose
//! ([`HELLO_GONE`], [`farewell`]): the same greeting and proofs, its proof also covering
//! why it stopped (at most [`REASON`] bytes, sent after the proof), so that its peers end
//! their join at once with that reason instead of waiting out the join's timeout.
//!
//! The acceptor's side never blocks ([`Greeting::poll`]): a connection that says nothing
//! (a port scanner, a stranger) is dropped after [`GREETING_TIMEOUT`] without holding up
//! the others.

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};

use crate::error::{Error, Result};

/// Opens the connection timely's network uses.
pub(super) const HELLO: &[u8; 8] = b"hydrant3";
/// Opens the connection the peers' heartbeats use (`heartbeat.rs`).
pub(super) const HELLO_BEAT: &[u8; 8] = b"hydrantD";
/// Opens a connection that tells a peer this process stopped before joining ([`farewell`]).
pub(super) const HELLO_GONE: &[u8; 8] = b"hydrantH";
/// What an acceptor answers a greeting of another version of this protocol with (a
/// purpose that begins `hydrant` but is not one of this build's), followed by its own
/// [`HELLO`]: the dialer then says at once that the two run different builds, where it
/// would have waited out the join for an answer.
pub(super) const OTHER_VERSION: &[u8; 8] = b"hydrant?";
/// The purposes of this build (`hydrant` and one byte, changed when the protocol changes).
const PURPOSES: [&[u8; 8]; 3] = [HELLO, HELLO_BEAT, HELLO_GONE];
/// The bytes of why a process stopped that a farewell carries (zero-padded, cut to fit).
pub(super) const REASON: usize = 200;

/// How long an accepted connection has to greet and prove itself (peers do at once).
const GREETING_TIMEOUT: Duration = Duration::from_secs(1);
/// How long a dialer waits to connect, and then for each answer.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
const ANSWER_TIMEOUT: Duration = Duration::from_secs(2);

/// What is said of a peer whose answer or proof was wrong.
pub(super) const UNPROVED: &str = "it did not prove the cluster's secret: it was started \
     with another --cluster-secret-file, or with none where this process has one, or the \
     other way round";

const NONCE: usize = 16;
const TAG: usize = 32;
/// Purpose, dialer's index, dialer's nonce.
const GREETING: usize = 8 + 8 + NONCE;
/// Purpose, acceptor's index, acceptor's nonce and tag.
const ANSWER: usize = 8 + 8 + NONCE + TAG;
/// What a dialer sends instead of its tag when the answer did not prove the secret.
const REFUSAL: [u8; TAG] = [0; TAG];
/// The acceptor's last word: the dialer's proof holds, the connection is the peer's.
const WELCOME: u8 = b'+';

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

/// A process's seat as a greeting carries it: its index in the low 32 bits, the number of
/// processes it was started with (`--processes`) in the high ones.
fn seat(index: usize, processes: usize) -> u64 {
    (index as u64 & u64::from(u32::MAX)) | (processes as u64) << 32
}

/// A seat's index and number of processes.
fn unseat(seat: u64) -> (usize, usize) {
    ((seat & u64::from(u32::MAX)) as usize, (seat >> 32) as usize)
}

/// What a peer started with another number of processes is told, and says of itself.
pub(super) fn other_size(theirs: usize, ours: usize) -> String {
    format!(
        "it was started with --processes {theirs}, and this process with --processes \
         {ours}: every process of a cluster takes the same --processes and hostfile"
    )
}

/// What is said of a peer that speaks `theirs` (a purpose, as text) where this process
/// speaks `ours`.
pub(super) fn other_version(theirs: &str, ours: &[u8; 8]) -> String {
    format!(
        "it runs another version of hydrant (cluster protocol `{}`, this process's `{}`): \
         run the same hydrant build on every process",
        crate::error::one_line(theirs.escape_default().to_string()),
        String::from_utf8_lossy(ours)
    )
}

/// What a tag covers: who signs it (`b'A'` the acceptor, `b'D'` the dialer), the
/// connection's purpose, the seats of who dials whom, and both nonces (the dialer's
/// first).
fn covered(by: u8, hello: &[u8; 8], (dialer, acceptor): (u64, u64), nonces: [&[u8]; 2]) -> Vec<u8> {
    let mut data = Vec::with_capacity(1 + 8 + 16 + 2 * NONCE);
    data.push(by);
    data.extend_from_slice(hello);
    data.extend_from_slice(&dialer.to_le_bytes());
    data.extend_from_slice(&acceptor.to_le_bytes());
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
    /// Nothing to talk to yet (the peer has not started listening): try again.
    NotYet,
    /// A connection, but no whole answer in time: try again, and say so if it lasts.
    Unanswered,
    /// An answer that does not prove this cluster's secret (the peer was started with
    /// another, or none, or something else listens at its address), or one from a peer
    /// started with another number of processes.
    Refused(String),
    /// A dial of this process's own seat: the acceptor is that seat of this cluster
    /// ([`holds_seat`]).
    ItsProofHeld,
}

/// A connection to process `to` at `address`, greeted as process `me` of `n` for
/// `hello`'s purpose, once both sides have proved they hold the secret of `key`.
pub(super) fn dial(
    address: &str,
    hello: &'static [u8; 8],
    (me, to, n): (usize, usize, usize),
    key: &hmac::Key,
) -> std::result::Result<TcpStream, NotJoined> {
    dial_with(address, hello, (me, to, n), key, &[])
}

/// Tells process `to` at `address`, still joining, that process `me` of `n` stopped
/// before it joined, and why (cut to [`REASON`] bytes); `Ok` once the peer has taken it
/// (whatever number of processes it was started with).
pub(super) fn farewell(
    address: &str,
    (me, to, n): (usize, usize, usize),
    key: &hmac::Key,
    why: &str,
) -> std::result::Result<(), NotJoined> {
    dial_with(address, HELLO_GONE, (me, to, n), key, &reason(why)).map(drop)
}

/// `why` as a farewell carries it: its first [`REASON`] bytes at most, cut where a
/// character starts, zero-padded.
fn reason(why: &str) -> [u8; REASON] {
    let mut reason = [0u8; REASON];
    let cut = (0..=why.len().min(REASON))
        .rev()
        .find(|&k| why.is_char_boundary(k))
        .unwrap_or(0);
    reason[..cut].copy_from_slice(&why.as_bytes()[..cut]);
    reason
}

/// Whether what listens at `address` is process `me` of this cluster (of `n` processes,
/// proving the secret of `key`): a second process `me` when this one cannot listen there.
/// It is asked as `me` would greet itself, and left unproved, so it joins nothing.
pub(super) fn holds_seat(address: &str, (me, n): (usize, usize), key: &hmac::Key) -> bool {
    let asked = dial_with(address, HELLO, (me, me, n), key, &[]);
    matches!(asked, Err(NotJoined::ItsProofHeld))
}

/// [`dial`], with `extra` sent after the dialer's proof and covered by it. A dial of
/// this process's own seat ([`holds_seat`]) stops once the acceptor's proof holds.
fn dial_with(
    address: &str,
    hello: &'static [u8; 8],
    (me, to, n): (usize, usize, usize),
    key: &hmac::Key,
    extra: &[u8],
) -> std::result::Result<TcpStream, NotJoined> {
    let mut stream = connect(address).ok_or(NotJoined::NotYet)?;
    let mine = nonce().ok_or(NotJoined::NotYet)?;
    let my_seat = seat(me, n);
    let mut greeting = Vec::with_capacity(GREETING);
    greeting.extend_from_slice(hello);
    greeting.extend_from_slice(&my_seat.to_le_bytes());
    greeting.extend_from_slice(&mine);
    let mut answer = [0u8; ANSWER];
    let deadline = Instant::now() + ANSWER_TIMEOUT;
    let sent = stream.set_nodelay(true).is_ok() && stream.write_all(&greeting).is_ok();
    // The purpose first: a port that is not hydrant's is told apart at once.
    let (purpose, rest) = answer.split_at_mut(8);
    if !sent || !read_by(&mut stream, purpose, deadline) {
        return Err(NotJoined::Unanswered);
    }
    if purpose == OTHER_VERSION {
        let mut theirs = [0u8; 8];
        let known = read_by(&mut stream, &mut theirs, deadline);
        let theirs = match known {
            true => String::from_utf8_lossy(&theirs).into_owned(),
            false => "unknown".into(),
        };
        return Err(NotJoined::Refused(other_version(&theirs, hello)));
    }
    if purpose != hello {
        return Err(NotJoined::Refused(
            "it does not answer as a process of a hydrant cluster".into(),
        ));
    }
    if !read_by(&mut stream, rest, deadline) {
        return Err(NotJoined::Unanswered);
    }
    let (their_seat, rest) = answer[8..].split_at(8);
    let (theirs, tag) = rest.split_at(NONCE);
    let their_seat = u64::from_le_bytes(their_seat.try_into().unwrap_or_default());
    let (index, their_n) = unseat(their_seat);
    if index != to {
        return Err(NotJoined::Refused(format!(
            "it answers as process {index}: do the processes' hostfiles agree?"
        )));
    }
    let seats = (my_seat, their_seat);
    let theirs_covered = covered(b'A', hello, seats, [&mine, theirs]);
    if hmac::verify(key, &theirs_covered, tag).is_err() {
        // So that the acceptor names this process too, rather than a silence (as long as
        // a proof and what it covers, so that the acceptor reads it whole).
        let _ = stream.write_all(&[&REFUSAL[..], &vec![0; extra.len()]].concat());
        return Err(NotJoined::Refused(UNPROVED.into()));
    }
    if me == to {
        return Err(match their_n == n {
            true => NotJoined::ItsProofHeld,
            false => NotJoined::Refused(other_size(their_n, n)),
        });
    }
    let mut proved = covered(b'D', hello, seats, [&mine, theirs]);
    proved.extend_from_slice(extra);
    let mut proof = hmac::sign(key, &proved).as_ref().to_vec();
    proof.extend_from_slice(extra);
    if their_n != n && hello != HELLO_GONE {
        // Proved, so that the acceptor believes it and says so too; not welcomed.
        let _ = stream.write_all(&proof);
        return Err(NotJoined::Refused(other_size(their_n, n)));
    }
    let mut welcome = [0u8; 1];
    let deadline = Instant::now() + ANSWER_TIMEOUT;
    let welcomed = stream.write_all(&proof).is_ok()
        && read_by(&mut stream, &mut welcome, deadline)
        && welcome[0] == WELCOME
        && stream.set_read_timeout(None).is_ok();
    if !welcomed {
        return Err(NotJoined::Unanswered);
    }
    Ok(stream)
}

/// Fills `buf` from `stream` by `deadline` (a peer that trickles its bytes cannot make
/// a dial last longer); false if it could not.
fn read_by(stream: &mut TcpStream, buf: &mut [u8], deadline: Instant) -> bool {
    let mut got = 0;
    while got < buf.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || stream.set_read_timeout(Some(left)).is_err() {
            return false;
        }
        match stream.read(&mut buf[got..]) {
            Ok(0) => return false,
            Ok(k) => got += k,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
    true
}

/// A connection to `address` within [`CONNECT_TIMEOUT`] (an address whose packets are
/// dropped must not hold up the join's loop), or `None`.
fn connect(address: &str) -> Option<TcpStream> {
    address
        .to_socket_addrs()
        .ok()?
        .find_map(|a| TcpStream::connect_timeout(&a, CONNECT_TIMEOUT).ok())
}

/// An accepted connection being greeted (without blocking).
pub(super) struct Greeting {
    stream: TcpStream,
    got: Vec<u8>,
    since: Instant,
    /// The purposes answered; any other greeting is dropped unanswered.
    purposes: &'static [&'static [u8; 8]],
    /// Once its greeting is read and answered.
    answered: Option<Answered>,
}

/// A greeting read and answered: what the connection is for, the seats of who dials
/// whom, and both nonces.
struct Answered {
    hello: &'static [u8; 8],
    seats: (u64, u64),
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
    /// A greeting as process `p`, whose proof was wrong (or refused the answer).
    Unproved(usize),
    /// Process `p`, proved, started with this number of processes, not this one's.
    OtherSize(usize, usize),
    /// A greeting of another version of this protocol (its purpose, as text), answered
    /// with [`OTHER_VERSION`] and this build's [`HELLO`].
    OtherVersion(String),
    /// Process `p`, proved, stopped before joining: why (as it said, cut to [`REASON`]
    /// bytes, as one line: see `said`).
    Gone(usize, String),
    /// Anything else: closed, silent past [`GREETING_TIMEOUT`], or not a greeting.
    Stranger,
}

impl Greeting {
    /// `stream`, accepted and set non-blocking, greeted for any purpose.
    pub fn new(stream: TcpStream) -> Self {
        Greeting::for_purposes(stream, &[HELLO, HELLO_BEAT, HELLO_GONE])
    }

    /// `stream`, accepted and set non-blocking, greeted only if it brings a farewell: a
    /// process that gives up hears its peers' farewells but joins no one (a peer it let
    /// join would take its silence for a loss, not hear why it stopped).
    pub fn farewell_only(stream: TcpStream) -> Self {
        Greeting::for_purposes(stream, &[HELLO_GONE])
    }

    fn for_purposes(stream: TcpStream, purposes: &'static [&'static [u8; 8]]) -> Self {
        Greeting {
            stream,
            got: Vec::with_capacity(GREETING),
            since: Instant::now(),
            purposes,
            answered: None,
        }
    }

    /// Reads what has arrived of the greeting or of the proof, answers a whole greeting,
    /// and checks a whole proof, as process `me` of `n` holding `key`.
    pub fn poll(mut self, (me, n): (usize, usize), key: &hmac::Key) -> Greeted {
        let want = match &self.answered {
            None => GREETING,
            Some(a) if a.hello == HELLO_GONE => TAG + REASON,
            Some(_) => TAG,
        };
        let mut buf = [0u8; TAG + REASON];
        match (&self.stream).read(&mut buf[..want - self.got.len()]) {
            Ok(0) => return Greeted::Stranger,
            Ok(k) => self.got.extend_from_slice(&buf[..k]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {}
            Err(_) => return Greeted::Stranger,
        }
        if self.answered.is_none()
            && self.got.len() >= 8
            && self.got.starts_with(b"hydrant")
            && !PURPOSES.iter().any(|p| self.got[..8] == p[..])
        {
            // Told at once, whatever the length of that version's greeting.
            let _ = (&self.stream).write(&[&OTHER_VERSION[..], &HELLO[..]].concat());
            return Greeted::OtherVersion(String::from_utf8_lossy(&self.got[..8]).into_owned());
        }
        if self.got.len() < want {
            return if self.since.elapsed() < GREETING_TIMEOUT {
                Greeted::Pending(self)
            } else {
                Greeted::Stranger
            };
        }
        match self.answered {
            None => self.answer(seat(me, n), key),
            Some(Answered {
                hello,
                seats,
                theirs,
                mine,
            }) => {
                let (dialer, their_n) = unseat(seats.0);
                let (tag, extra) = self.got.split_at(TAG);
                let mut data = covered(b'D', hello, seats, [&theirs, &mine]);
                data.extend_from_slice(extra);
                if hmac::verify(key, &data, tag).is_err() {
                    return Greeted::Unproved(dialer);
                }
                if hello == HELLO_GONE {
                    let _ = (&self.stream).write(&[WELCOME]);
                    return Greeted::Gone(dialer, said(extra));
                }
                if their_n != n {
                    return Greeted::OtherSize(dialer, their_n);
                }
                // One byte fits a fresh connection's send buffer at once.
                let ready = matches!((&self.stream).write(&[WELCOME]), Ok(1))
                    && self.stream.set_nonblocking(false).is_ok()
                    && self.stream.set_nodelay(true).is_ok();
                if ready {
                    Greeted::Peer(hello, dialer, self.stream)
                } else {
                    Greeted::Stranger
                }
            }
        }
    }

    /// Answers a whole greeting with this side's purpose, seat, nonce and tag.
    fn answer(mut self, me: u64, key: &hmac::Key) -> Greeted {
        let Some(&hello) = self
            .purposes
            .iter()
            .find(|k| &self.got[..8] == k.as_slice())
        else {
            return Greeted::Stranger;
        };
        let dialer = u64::from_le_bytes(self.got[8..16].try_into().unwrap_or_default());
        let mut theirs = [0u8; NONCE];
        theirs.copy_from_slice(&self.got[16..GREETING]);
        let Some(mine) = nonce() else {
            return Greeted::Stranger;
        };
        let tag = hmac::sign(key, &covered(b'A', hello, (dialer, me), [&theirs, &mine]));
        let mut answer = Vec::with_capacity(ANSWER);
        answer.extend_from_slice(hello);
        answer.extend_from_slice(&me.to_le_bytes());
        answer.extend_from_slice(&mine);
        answer.extend_from_slice(tag.as_ref());
        // A fresh connection's send buffer takes 64 bytes at once; one that does not is
        // not worth waiting for.
        if !matches!((&self.stream).write(&answer), Ok(n) if n == ANSWER) {
            return Greeted::Stranger;
        }
        self.got.clear();
        self.answered = Some(Answered {
            hello,
            seats: (dialer, me),
            theirs,
            mine,
        });
        Greeted::Pending(self)
    }
}

/// What a farewell's reason says, as text of one line: up to its padding, invalid UTF-8
/// replaced, runs of whitespace and control characters as one space, and no characters
/// that only steer how text is shown (bidirectional overrides, zero-width ones).
fn said(reason: &[u8]) -> String {
    let end = reason.iter().position(|&b| b == 0).unwrap_or(reason.len());
    let steers = |c: char| {
        matches!(
            c,
            '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2060}'..='\u{206f}' | '\u{feff}'
        )
    };
    let text: String = String::from_utf8_lossy(&reason[..end])
        .chars()
        .filter(|&c| !steers(c))
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    crate::error::one_line(text)
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;

    use super::*;

    /// What process 0, holding `key`, makes of a farewell from process 1 dialed by hand
    /// with the same key, whose proof covers `signed` but which sends `sent`.
    fn farewell_by_hand(key: &hmac::Key, signed: &str, sent: &str) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let at = listener.local_addr().unwrap();
        let acceptor_key = key.clone();
        let acceptor = std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            stream.set_nonblocking(true).unwrap();
            let mut greeting = Greeting::new(stream);
            loop {
                match greeting.poll((0, 2), &acceptor_key) {
                    Greeted::Pending(g) => greeting = g,
                    Greeted::Gone(p, why) => return format!("gone {p}: {why}"),
                    Greeted::Unproved(p) => return format!("unproved {p}"),
                    Greeted::OtherSize(p, n) => return format!("{p} of {n}"),
                    Greeted::Peer(..) => return "peer".into(),
                    Greeted::Stranger => return "stranger".into(),
                    Greeted::OtherVersion(v) => return format!("version {v}"),
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        let mut stream = TcpStream::connect(at).unwrap();
        let mine = [5u8; NONCE];
        stream
            .write_all(&[&HELLO_GONE[..], &seat(1, 2).to_le_bytes(), &mine].concat())
            .unwrap();
        let mut answer = [0u8; ANSWER];
        stream.read_exact(&mut answer).unwrap();
        let theirs = &answer[16..16 + NONCE];
        let mut proved = covered(b'D', HELLO_GONE, (seat(1, 2), seat(0, 2)), [&mine, theirs]);
        proved.extend_from_slice(&reason(signed));
        let tag = hmac::sign(key, &proved);
        stream
            .write_all(&[tag.as_ref(), &reason(sent)[..]].concat())
            .unwrap();
        acceptor.join().unwrap()
    }

    #[test]
    fn a_farewell_is_believed_only_as_it_was_signed() {
        let key = key(Some(&ClusterSecret::new(b"0123456789abcdef").unwrap()));
        let why = "input a.parquet: no such file";
        assert_eq!(farewell_by_hand(&key, why, why), format!("gone 1: {why}"));
        // One byte of the reason changed on the way: not believed.
        let changed = "input b.parquet: no such file";
        assert_eq!(farewell_by_hand(&key, why, changed), "unproved 1");
    }

    /// Processes of two builds whose protocols differ could not join, and the dialer
    /// waited out the join's minute for an answer the acceptor never gave. Now the
    /// acceptor answers a greeting of another version at once, and the dialer says why.
    #[test]
    fn a_process_of_another_version_is_told_so_at_once() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let at = listener.local_addr().unwrap().to_string();
        let acceptor = std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            stream.set_nonblocking(true).unwrap();
            let mut greeting = Greeting::new(stream);
            loop {
                match greeting.poll((0, 2), &key(None)) {
                    Greeted::Pending(g) => greeting = g,
                    Greeted::OtherVersion(v) => return v,
                    _ => return "something else".into(),
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        let started = Instant::now();
        let refused = dial(&at, b"hydrant9", (1, 0, 2), &key(None));
        let Err(NotJoined::Refused(why)) = refused else {
            panic!("not refused");
        };
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{:?}",
            started.elapsed()
        );
        let said = "another version of hydrant (cluster protocol `hydrant3`, this process's \
                    `hydrant9`)";
        assert!(why.contains(said), "{why}");
        assert_eq!(acceptor.join().unwrap(), "hydrant9");
    }

    #[test]
    fn a_reason_is_cut_where_a_character_starts_and_read_as_one_line() {
        // 67 three-byte characters fill 201 bytes: the last does not fit.
        let why = "€".repeat(67);
        let bytes = reason(&why);
        assert_eq!(said(&bytes), "€".repeat(66));
        assert_eq!(said(&reason("short")), "short");
        assert_eq!(
            said(&reason("two\nlines\r\tand a\u{7}bell \u{202e}\u{2028}x")),
            "two lines and a bell x"
        );
        // What a peer sends need not be UTF-8.
        let mut odd = [0u8; REASON];
        odd[..3].copy_from_slice(&[b'a', 0xff, b'b']);
        assert_eq!(said(&odd), "a\u{fffd}b");
    }
}
