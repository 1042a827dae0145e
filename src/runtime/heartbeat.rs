//! Heartbeats between the processes of a cluster, so that a peer that stops answering
//! without closing its connections is noticed.
//!
//! A peer that dies closes its sockets, and timely's network threads see it at once
//! (`fate.rs`). A peer that is stopped (`SIGSTOP`, a hung VM) or cut off (its host lost
//! power, a network partition) closes nothing: its kernel, or nobody, answers, and
//! timely's threads would wait for its progress forever. So each pair of processes also
//! keeps a connection of its own that carries one byte a second each way. Silence for
//! [`SILENCE`] is a lost peer; a peer whose job finished says so ([`END`]) before it
//! closes, and is not missed after that.
//!
//! The same connections carry a caller's [`Signals`]: a number sent to every peer of a
//! running job, beside the dataflow (a serving cluster's trainer that waits on a rank no
//! one reads tells the rank's process this way).
//!
//! Written by hand: one thread per peer reading with a timeout is all it takes, and no
//! crate in the tree (tokio is not running in every process that joins a cluster) does
//! it for plain sockets.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How often a process says it is alive.
pub(super) const INTERVAL: Duration = Duration::from_secs(1);

/// How long a peer may say nothing before it is taken for lost.
pub(super) const SILENCE: Duration = Duration::from_secs(8);

/// How often beats go out, and how long a peer may be silent: [`Pace::silence`] once it
/// has been heard, [`Pace::first`] before (a peer may still be greeting other processes
/// when this one starts listening).
#[derive(Debug, Clone, Copy)]
pub(super) struct Pace {
    pub interval: Duration,
    pub silence: Duration,
    pub first: Duration,
}

/// "Still here."
const BEAT: u8 = b'.';
/// "My part of the job is over": silence from here on is not a failure.
const END: u8 = b'$';
/// A signal: its number follows, 8 bytes little-endian.
const SIGNAL: u8 = b'!';

/// The sending half of a peer's connection, shared by its watcher (beats), the job's
/// end and [`Signals::send`], so that their frames do not interleave.
type Writer = Arc<Mutex<TcpStream>>;

/// Writes one whole frame. A write that fails may have sent part of it, after which the
/// peer would misread every byte: the connection is shut, so that the peer sees it close
/// rather than frames out of step.
fn write(to: &Writer, bytes: &[u8]) -> std::io::Result<()> {
    let mut stream = to.lock().unwrap_or_else(PoisonError::into_inner);
    stream.write_all(bytes).inspect_err(|_| {
        let _ = stream.shutdown(std::net::Shutdown::Both);
    })
}

/// Numbers the processes of a running job send each other beside its dataflow, each
/// heard by every other process's `on_signal(sender, number)` on a heartbeat's thread
/// (which must not block: no beats go out to that peer meanwhile). What a number means
/// is the caller's. A signal sent while no job runs, or to a peer
/// whose connection is gone, is lost: callers send again what still matters.
#[derive(Clone)]
pub struct Signals(Arc<SignalsInner>);

struct SignalsInner {
    /// The running job's peers' connections (none between jobs).
    peers: Mutex<Vec<Writer>>,
    on_signal: Box<dyn Fn(usize, u64) + Send + Sync>,
}

impl Signals {
    /// Signals whose arrivals `on_signal` hears.
    pub fn new(on_signal: impl Fn(usize, u64) + Send + Sync + 'static) -> Self {
        Signals(Arc::new(SignalsInner {
            peers: Mutex::default(),
            on_signal: Box::new(on_signal),
        }))
    }

    /// Sends `number` to every peer of the running job; returns how many it reached. A
    /// socket write each, which may block while a peer's buffers are full (for at most
    /// the heartbeat's silence): call it off async tasks.
    pub fn send(&self, number: u64) -> usize {
        let peers = self
            .0
            .peers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let mut frame = [SIGNAL; 9];
        frame[1..].copy_from_slice(&number.to_le_bytes());
        peers.iter().filter(|p| write(p, &frame).is_ok()).count()
    }

    fn hear(&self, peer: usize, number: u64) {
        (self.0.on_signal)(peer, number);
    }

    fn connect(&self, peers: &[Writer]) {
        *self.0.peers.lock().unwrap_or_else(PoisonError::into_inner) = peers.to_vec();
    }

    /// Forgets `peers`, if they are still the ones signals go to (a later job's stay).
    fn disconnect(&self, peers: &[Writer]) {
        let mut now = self.0.peers.lock().unwrap_or_else(PoisonError::into_inner);
        let same =
            now.len() == peers.len() && now.iter().zip(peers).all(|(a, b)| Arc::ptr_eq(a, b));
        if same {
            now.clear();
        }
    }
}

impl std::fmt::Debug for Signals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Signals")
    }
}

/// What a watcher calls when its peer is lost: `(peer, what was seen)`.
pub(super) type OnLost = Arc<dyn Fn(usize, String) + Send + Sync>;

/// The heartbeats of one job with each of its peers. Dropped without [`Heartbeat::finish`]
/// (the job failed), it stops beating, and the peers see the connections close.
pub(super) struct Heartbeat {
    peers: Vec<Writer>,
    stop: Arc<AtomicBool>,
    signals: Option<Signals>,
}

impl Heartbeat {
    /// Starts a thread per `(peer, connection)`, beating at `pace` and calling `lost` if
    /// the peer is silent for longer than `pace` allows, closes without saying it ended,
    /// or its connection fails; `signals` then reach the peers, and theirs are heard.
    pub(super) fn start(
        peers: Vec<(usize, TcpStream)>,
        pace: Pace,
        lost: OnLost,
        signals: Option<Signals>,
    ) -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let mut kept = Vec::new();
        for (peer, stream) in peers {
            stream.set_read_timeout(Some(pace.interval))?;
            stream.set_write_timeout(Some(pace.silence))?;
            let writer = Arc::new(Mutex::new(stream.try_clone()?));
            kept.push(writer.clone());
            let watcher = Watcher {
                peer,
                writer,
                pace,
                stop: stop.clone(),
                signals: signals.clone(),
            };
            let lost = lost.clone();
            std::thread::Builder::new()
                .name(format!("hydrant-heartbeat-{peer}"))
                .spawn(move || {
                    if let Err(seen) = watcher.watch(stream)
                        && !watcher.stop.load(Ordering::Acquire)
                    {
                        lost(peer, seen);
                    }
                })?;
        }
        if let Some(s) = &signals {
            s.connect(&kept);
        }
        Ok(Heartbeat {
            peers: kept,
            stop,
            signals,
        })
    }

    /// Tells every peer that this process's part of the job is over, before the process
    /// may exit (from this thread: a watcher may be asleep), and stops the watchers.
    pub(super) fn finish(self) {
        self.stop.store(true, Ordering::Release);
        for peer in &self.peers {
            let _ = write(peer, &[END]);
        }
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(s) = &self.signals {
            s.disconnect(&self.peers);
        }
    }
}

/// One peer's watcher: beats to it and listens to it.
struct Watcher {
    peer: usize,
    writer: Writer,
    pace: Pace,
    stop: Arc<AtomicBool>,
    signals: Option<Signals>,
}

/// What a peer's bytes said so far.
#[derive(Default)]
struct Frames {
    /// A signal's number and how many of its bytes were read, once its [`SIGNAL`] was.
    number: Option<([u8; 8], usize)>,
}

impl Frames {
    /// Reads `bytes`, handing each whole signal to `hear`; true once the peer said
    /// [`END`]. Bytes that mean nothing are skipped.
    fn read(&mut self, bytes: &[u8], mut hear: impl FnMut(u64)) -> bool {
        for &b in bytes {
            if let Some((number, got)) = &mut self.number {
                number[*got] = b;
                *got += 1;
                if *got == number.len() {
                    hear(u64::from_le_bytes(*number));
                    self.number = None;
                }
                continue;
            }
            match b {
                END => return true,
                SIGNAL => self.number = Some(([0; 8], 0)),
                _ => {}
            }
        }
        false
    }
}

impl Watcher {
    /// Beats to the peer and listens to it until `stop` is set (`Ok`) or it is lost
    /// (`Err`, saying how). A peer that said it ended is not watched any longer.
    ///
    /// Silence is counted only while this thread looks: after a gap of its own (this
    /// process was stopped, or its thread not run, for more than two intervals) the peer
    /// gets a full silence again, since whatever it sent meanwhile is still to be read and
    /// what it did not send is not its fault (a whole cluster suspended and resumed is not
    /// a loss).
    fn watch(&self, mut stream: TcpStream) -> Result<(), String> {
        let pace = self.pace;
        let mut heard = false;
        let mut since = Instant::now();
        let mut looked = Instant::now();
        let mut beaten: Option<Instant> = None;
        let mut frames = Frames::default();
        let mut buf = [0u8; 64];
        while !self.stop.load(Ordering::Acquire) {
            if beaten.is_none_or(|t| t.elapsed() >= pace.interval) {
                write(&self.writer, &[BEAT])
                    .map_err(|e| format!("its heartbeat connection failed: {e}"))?;
                beaten = Some(Instant::now());
            }
            match stream.read(&mut buf) {
                Ok(0) => return Err("its heartbeat connection closed".into()),
                Ok(n) => {
                    let signals = self.signals.as_ref();
                    let hear = |number| signals.map_or((), |s| s.hear(self.peer, number));
                    if frames.read(&buf[..n], hear) {
                        return Ok(());
                    }
                    heard = true;
                    since = Instant::now();
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("its heartbeat connection failed: {e}")),
            }
            // A read that took far longer than its timeout spanned a stop of this process.
            if looked.elapsed() > 2 * pace.interval {
                since = Instant::now();
            }
            looked = Instant::now();
            let allowed = if heard { pace.silence } else { pace.first };
            if since.elapsed() >= allowed {
                return Err(format!(
                    "no word from it for {} s (stopped, hung or cut off)",
                    allowed.as_secs()
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;
    use std::sync::mpsc::{self, RecvTimeoutError, TryRecvError};

    use super::*;

    const FAST: Pace = Pace {
        interval: Duration::from_millis(20),
        silence: Duration::from_millis(300),
        first: Duration::from_millis(300),
    };

    /// A connected pair of loopback sockets.
    fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (b, _) = listener.accept().unwrap();
        (a, b)
    }

    /// A heartbeat with peer 7 over `stream`, and what it reports lost.
    fn watched(stream: TcpStream) -> (Heartbeat, mpsc::Receiver<(usize, String)>) {
        watched_at(stream, FAST)
    }

    fn watched_at(stream: TcpStream, pace: Pace) -> (Heartbeat, mpsc::Receiver<(usize, String)>) {
        let (tx, rx) = mpsc::channel();
        let tx = std::sync::Mutex::new(tx);
        let lost: OnLost = Arc::new(move |p, seen| {
            let _ = tx.lock().unwrap().send((p, seen));
        });
        (
            Heartbeat::start(vec![(7, stream)], pace, lost, None).unwrap(),
            rx,
        )
    }

    #[test]
    fn a_peer_not_yet_heard_has_longer() {
        let (a, mut b) = pair();
        let pace = Pace {
            first: Duration::from_secs(3),
            ..FAST
        };
        let (_watching, from_a) = watched_at(a, pace);
        // Twice the silence without a word: still greeting, not lost.
        let quiet = Duration::from_millis(600);
        assert_eq!(from_a.recv_timeout(quiet), Err(RecvTimeoutError::Timeout));
        // Heard once, then silent: lost after the ordinary silence.
        b.write_all(&[BEAT]).unwrap();
        let (_, seen) = from_a.recv_timeout(Duration::from_secs(2)).unwrap();
        assert!(seen.contains("no word from it"), "{seen}");
    }

    #[test]
    fn a_silent_peer_is_lost_and_a_beating_one_is_not() {
        let (a, b) = pair();
        let (_beating, from_a) = watched(a);
        let (_other, from_b) = watched(b);
        let (silent_side, _keep) = pair();
        let (_watching, from_silent) = watched(silent_side);
        // The silent peer (`_keep`, never read or written) is lost after the silence.
        let (peer, seen) = from_silent.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(peer, 7);
        assert!(seen.contains("no word from it"), "{seen}");
        // `a` and `b` beat to each other: nothing is lost over several silences, and
        // both still watch.
        let quiet = Duration::from_millis(1000);
        assert_eq!(from_a.recv_timeout(quiet), Err(RecvTimeoutError::Timeout));
        assert_eq!(from_b.try_recv(), Err(TryRecvError::Empty));
    }

    #[test]
    fn a_peer_that_finished_is_not_missed_and_one_that_vanished_is() {
        let (a, b) = pair();
        let (watching, from_a) = watched(a);
        let (finishing, _) = watched(b);
        std::thread::sleep(Duration::from_millis(100));
        finishing.finish();
        // `b`'s side is closed after its END: `a`'s watcher ends without a word (its
        // callback, the channel's only sender, is dropped unused).
        let wait = Duration::from_secs(5);
        assert_eq!(
            from_a.recv_timeout(wait),
            Err(RecvTimeoutError::Disconnected)
        );
        drop(watching);

        let (c, d) = pair();
        let (_watching, from_c) = watched(c);
        drop(d); // closed without an END: a peer that died
        let (_, seen) = from_c.recv_timeout(Duration::from_secs(5)).unwrap();
        assert!(seen.contains("closed") || seen.contains("failed"), "{seen}");
    }

    #[test]
    fn a_stopped_heartbeat_reports_nothing() {
        let (a, _b) = pair();
        let (watching, from_a) = watched(a);
        drop(watching);
        let wait = Duration::from_secs(5);
        assert_eq!(
            from_a.recv_timeout(wait),
            Err(RecvTimeoutError::Disconnected)
        );
    }

    #[test]
    fn signals_reach_the_peer_whole_whatever_the_reads_cut() {
        let mut frames = Frames::default();
        let mut heard = Vec::new();
        let mut bytes = vec![BEAT, b'x', SIGNAL];
        bytes.extend(u64::MAX.to_le_bytes());
        // A number whose bytes look like END and SIGNAL is still a number.
        let tricky = u64::from_le_bytes([END, SIGNAL, BEAT, 0, 0, 0, 0, END]);
        bytes.push(SIGNAL);
        bytes.extend(tricky.to_le_bytes());
        for piece in bytes.chunks(3) {
            assert!(!frames.read(piece, |n| heard.push(n)));
        }
        assert_eq!(heard, [u64::MAX, tricky]);
        assert!(frames.read(&[BEAT, END, SIGNAL], |n| heard.push(n)));

        // Between two processes: each hears the other's, and no one its own.
        let (a, b) = pair();
        let heard = |tx: mpsc::Sender<(usize, u64)>| {
            let tx = std::sync::Mutex::new(tx);
            Signals::new(move |peer, n| {
                let _ = tx.lock().unwrap().send((peer, n));
            })
        };
        let (to_a, at_a) = mpsc::channel();
        let (to_b, at_b) = mpsc::channel();
        let (sa, sb) = (heard(to_a), heard(to_b));
        let lost: OnLost = Arc::new(|_, _| {});
        let ha = Heartbeat::start(vec![(1, a)], FAST, lost.clone(), Some(sa.clone())).unwrap();
        let hb = Heartbeat::start(vec![(0, b)], FAST, lost, Some(sb.clone())).unwrap();
        assert_eq!(sa.send(7), 1);
        assert_eq!(sb.send(8), 1);
        let wait = Duration::from_secs(5);
        assert_eq!(at_b.recv_timeout(wait), Ok((0, 7)));
        assert_eq!(at_a.recv_timeout(wait), Ok((1, 8)));
        assert_eq!(at_a.try_recv(), Err(TryRecvError::Empty));
        // Once the job is over, a signal reaches no one.
        hb.finish();
        drop(ha);
        assert_eq!(sa.send(9), 0);
        assert_eq!(sb.send(9), 0);
    }
}
