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
//! Written by hand: one thread per peer reading with a timeout is all it takes, and no
//! crate in the tree (tokio is not running in every process that joins a cluster) does
//! it for plain sockets.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
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

/// What a watcher calls when its peer is lost: `(peer, what was seen)`.
pub(super) type OnLost = Arc<dyn Fn(usize, String) + Send + Sync>;

/// The heartbeats of one job with each of its peers. Dropped without [`Heartbeat::finish`]
/// (the job failed), it stops beating, and the peers see the connections close.
pub(super) struct Heartbeat {
    peers: Vec<TcpStream>,
    stop: Arc<AtomicBool>,
}

impl Heartbeat {
    /// Starts a thread per `(peer, connection)`, beating at `pace` and calling `lost` if
    /// the peer is silent for longer than `pace` allows, closes without saying it ended,
    /// or its connection fails.
    pub(super) fn start(
        peers: Vec<(usize, TcpStream)>,
        pace: Pace,
        lost: OnLost,
    ) -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let mut kept = Vec::new();
        for (peer, stream) in peers {
            stream.set_read_timeout(Some(pace.interval))?;
            stream.set_write_timeout(Some(pace.silence))?;
            kept.push(stream.try_clone()?);
            let (stop, lost) = (stop.clone(), lost.clone());
            std::thread::Builder::new()
                .name(format!("hydrant-heartbeat-{peer}"))
                .spawn(move || {
                    if let Err(seen) = watch(stream, pace, &stop)
                        && !stop.load(Ordering::Acquire)
                    {
                        lost(peer, seen);
                    }
                })?;
        }
        Ok(Heartbeat { peers: kept, stop })
    }

    /// Tells every peer that this process's part of the job is over, before the process
    /// may exit (from this thread: a watcher may be asleep), and stops the watchers.
    pub(super) fn finish(self) {
        self.stop.store(true, Ordering::Release);
        for mut peer in &self.peers {
            let _ = peer.write_all(&[END]);
        }
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

/// Beats to the peer and listens to it until `stop` is set (`Ok`) or it is lost (`Err`,
/// saying how). A peer that said it ended is not watched any longer.
///
/// Silence is counted only while this thread looks: after a gap of its own (this process
/// was stopped, or its thread not run, for more than two intervals) the peer gets a full
/// silence again, since whatever it sent meanwhile is still to be read and what it did
/// not send is not its fault (a whole cluster suspended and resumed is not a loss).
fn watch(mut stream: TcpStream, pace: Pace, stop: &AtomicBool) -> Result<(), String> {
    let mut heard = false;
    let mut since = Instant::now();
    let mut looked = Instant::now();
    let mut beaten: Option<Instant> = None;
    let mut buf = [0u8; 64];
    while !stop.load(Ordering::Acquire) {
        if beaten.is_none_or(|t| t.elapsed() >= pace.interval) {
            stream
                .write_all(&[BEAT])
                .map_err(|e| format!("its heartbeat connection failed: {e}"))?;
            beaten = Some(Instant::now());
        }
        match stream.read(&mut buf) {
            Ok(0) => return Err("its heartbeat connection closed".into()),
            Ok(n) if buf[..n].contains(&END) => return Ok(()),
            Ok(_) => {
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
        (Heartbeat::start(vec![(7, stream)], pace, lost).unwrap(), rx)
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
}
