//! A process that stops before it joins its cluster tells its peers why
//! ([`Cluster::give_up`]), and hears the same word from peers that stopped too.

use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::cluster::{Cluster, JOIN_POLL};
use super::handshake::{self, Greeted, Greeting, NotJoined};

/// How long a process that stopped before joining keeps trying to tell its peers
/// ([`Cluster::give_up`]): long enough for peers started a little later to listen.
pub const GIVE_UP_WAIT: Duration = Duration::from_secs(5);

/// The most threads [`Cluster::give_up`] tells peers from.
const TELLERS: usize = 16;

impl Cluster {
    /// Tells the other processes, which may be waiting for this one to join (at start-up,
    /// or between the jobs of one command), that it stopped and why: they end their join
    /// at once with one line naming this process and `why`, not after [`JOIN_TIMEOUT`](super::JOIN_TIMEOUT).
    /// Tries the peers from several threads at once, each until told or [`GIVE_UP_WAIT`]
    /// has passed (a peer not listening yet may still start; a dial under way then still
    /// finishes, a few seconds at most), and returns the peers told. Meanwhile it listens
    /// on this process's port for the same word from its peers: a peer that stopped too
    /// is not waited for. Call it only where this process has not joined the job that
    /// failed: peers that have are told by its heartbeats, and are not listening. Nothing
    /// to do for one process.
    pub fn give_up(&self, why: &str) -> Vec<usize> {
        self.give_up_within(why, GIVE_UP_WAIT)
    }

    fn give_up_within(&self, why: &str, wait: Duration) -> Vec<usize> {
        let addresses = match (self.check(), self.addresses()) {
            (Ok(()), Ok(addresses)) if self.processes > 1 => addresses,
            _ => return Vec::new(),
        };
        let key = handshake::key(self.secret.as_ref());
        let (me, deadline) = (self.process, Instant::now() + wait);
        // Peers that said they stopped too: not told. When every process fails the same
        // way (the same wrong path on every node), each hears the others at once and
        // none waits out `wait` for peers that will never listen.
        let gone: Vec<AtomicBool> = (0..self.processes)
            .map(|_| AtomicBool::new(false))
            .collect();
        // Tells `peers` in turn, again and again, until each is told, has gone, is not of
        // this cluster, or the time is up; returns those told.
        let tell = |peers: Vec<usize>| {
            let (mut left, mut told) = (peers, Vec::new());
            while !left.is_empty() {
                left.retain(|&p| {
                    if gone[p].load(Ordering::Relaxed) {
                        return false;
                    }
                    match handshake::farewell(&addresses[p], (me, p, addresses.len()), &key, why) {
                        Ok(()) => {
                            told.push(p);
                            false
                        }
                        // Not of this cluster (another secret, another program).
                        Err(NotJoined::Refused(_) | NotJoined::ItsProofHeld) => false,
                        Err(NotJoined::NotYet | NotJoined::Unanswered) => true,
                    }
                });
                if Instant::now() >= deadline {
                    break;
                }
                std::thread::sleep(JOIN_POLL);
            }
            told
        };
        // This process's own port, to hear the others' farewells on (where it is free:
        // not when it failed because its port is taken).
        let listener = TcpListener::bind(&addresses[me])
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .ok();
        // A few threads share the peers, so that a slow peer (a dial may take seconds)
        // holds up only its share, and a cluster of thousands starts no more threads.
        let peers: Vec<usize> = (0..self.processes).filter(|&p| p != me).collect();
        let threads = peers.len().min(TELLERS);
        let share = |t: usize| peers.iter().copied().skip(t).step_by(threads).collect();
        let mut told: Vec<usize> = std::thread::scope(|s| {
            let tellers: Vec<_> = (0..threads)
                .map(|t| {
                    let thread = std::thread::Builder::new().name("hydrant-give-up".into());
                    (t, thread.spawn_scoped(s, move || tell(share(t))))
                })
                .collect();
            if let Some(listener) = &listener {
                let telling = || {
                    tellers
                        .iter()
                        .any(|(_, t)| t.as_ref().is_ok_and(|t| !t.is_finished()))
                };
                hear_farewells(listener, me, &key, &gone, telling);
            }
            tellers
                .into_iter()
                .flat_map(|(t, thread)| match thread {
                    Ok(thread) => thread.join().unwrap_or_default(),
                    // No thread to be had: told from here, after the others.
                    Err(_) => tell(share(t)),
                })
                .collect()
        });
        told.sort_unstable();
        told
    }
}

/// Marks in `gone` each peer whose farewell `listener` hears, while `telling`: a process
/// giving up answers farewells only (see [`Greeting::farewell_only`]).
fn hear_farewells(
    listener: &TcpListener,
    me: usize,
    key: &ring::hmac::Key,
    gone: &[AtomicBool],
    telling: impl Fn() -> bool,
) {
    let mut greeting: Vec<Greeting> = Vec::new();
    while telling() {
        while let Ok((stream, _)) = listener.accept() {
            if stream.set_nonblocking(true).is_ok() {
                greeting.push(Greeting::farewell_only(stream));
            }
        }
        for g in std::mem::take(&mut greeting) {
            match g.poll((me, gone.len()), key) {
                Greeted::Pending(g) => greeting.push(g),
                Greeted::Gone(p, _) if p < gone.len() => gone[p].store(true, Ordering::Relaxed),
                _ => {}
            }
        }
        std::thread::sleep(JOIN_POLL);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::runtime::cluster::tests::{free, join_at};
    use crate::runtime::handshake::ClusterSecret;

    /// Process `me` of a cluster of `addresses` (written to a hostfile in `dir`).
    fn process_of(dir: &std::path::Path, addresses: &[String], me: usize) -> Cluster {
        let hosts = dir.join("hosts");
        std::fs::write(&hosts, addresses.join("\n")).unwrap();
        Cluster {
            workers: 1,
            processes: addresses.len(),
            process: me,
            hostfile: Some(hosts),
            secret: None,
        }
    }

    #[test]
    fn a_process_that_gives_up_is_named_with_its_reason_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let addresses: Vec<String> = (0..3).map(|_| free()).collect();
        let joining: Vec<_> = [0, 2]
            .into_iter()
            .map(|me| {
                let a = addresses.clone();
                std::thread::spawn(move || {
                    let started = Instant::now();
                    let key = handshake::key(None);
                    let err = join_at(&a, me, Duration::from_secs(30), &key).unwrap_err();
                    (err.to_string(), started.elapsed())
                })
            })
            .collect();
        // Process 1 (one that 0 waits to be dialed by, one that 2 dials) fails: a reason
        // past what a farewell carries, with a line break in it.
        let why = format!("input a.parquet: no such file\n{}", "x".repeat(400));
        let told = process_of(dir.path(), &addresses, 1).give_up(&why);
        assert_eq!(told, vec![0, 2]);
        for j in joining {
            let (err, took) = j.join().unwrap();
            assert!(
                err.contains("process 1 (") && err.contains("stopped before joining"),
                "{err}"
            );
            assert!(err.contains("input a.parquet: no such file xxx"), "{err}");
            assert!(!err.contains('\n') && err.len() < 400, "{err}");
            assert!(took < Duration::from_secs(5), "{took:?}");
        }
    }

    #[test]
    fn a_farewell_without_the_secret_is_not_believed() {
        let dir = tempfile::tempdir().unwrap();
        let addresses = vec![free(), free()];
        let a = addresses.clone();
        let ours = handshake::key(Some(&ClusterSecret::new(b"0123456789abcdef").unwrap()));
        let first = std::thread::spawn(move || join_at(&a, 0, Duration::from_millis(1500), &ours));
        // Process 1 as a stranger would say it (no secret): process 0 is not told, and
        // waits out its join, naming what it saw.
        let stranger = process_of(dir.path(), &addresses, 1);
        assert_eq!(stranger.give_up("stop, all of you"), Vec::<usize>::new());
        let err = first.join().unwrap().unwrap_err().to_string();
        assert!(err.contains("did not join the cluster"), "{err}");
        assert!(err.contains("did not prove the cluster's secret"), "{err}");
        assert!(!err.contains("stop, all of you"), "{err}");
    }

    #[test]
    fn a_farewell_with_the_secret_is_believed() {
        let dir = tempfile::tempdir().unwrap();
        let secret = ClusterSecret::new(b"0123456789abcdef").unwrap();
        let addresses = vec![free(), free()];
        let a = addresses.clone();
        let key = handshake::key(Some(&secret));
        let first = std::thread::spawn(move || join_at(&a, 0, Duration::from_secs(30), &key));
        let holder = Cluster {
            secret: Some(secret),
            ..process_of(dir.path(), &addresses, 1)
        };
        assert_eq!(holder.give_up("state s.json: not a fitted state"), vec![0]);
        let err = first.join().unwrap().unwrap_err().to_string();
        assert!(
            err.contains("stopped before joining the cluster: state s.json"),
            "{err}"
        );
    }

    #[test]
    fn giving_up_alone_or_with_no_one_listening_ends() {
        let dir = tempfile::tempdir().unwrap();
        assert!(Cluster::local(2).give_up("no peers").is_empty());
        let wait = Duration::from_millis(300);
        let started = Instant::now();
        // More peers than threads tell them.
        let addresses: Vec<String> = (0..TELLERS * 2 + 3).map(|_| free()).collect();
        let told = process_of(dir.path(), &addresses, 1).give_up_within("no one listens", wait);
        assert!(told.is_empty());
        let took = started.elapsed();
        assert!(
            took >= wait && took < wait + Duration::from_secs(2),
            "{took:?}"
        );
    }

    /// Every process failing the same way (the same wrong path on every node): each hears
    /// the others' farewells and ends at once, not after the wait for peers to listen.
    #[test]
    fn processes_that_all_give_up_end_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let addresses: Vec<String> = (0..3).map(|_| free()).collect();
        let cluster: Vec<Cluster> = (0..3)
            .map(|p| process_of(dir.path(), &addresses, p))
            .collect();
        let wait = Duration::from_secs(5);
        let started = Instant::now();
        let took: Vec<Duration> = std::thread::scope(|s| {
            let giving_up: Vec<_> = cluster
                .iter()
                .map(|c| {
                    s.spawn(move || {
                        c.give_up_within("input data.parquet: No such file", wait);
                        started.elapsed()
                    })
                })
                .collect();
            giving_up.into_iter().map(|t| t.join().unwrap()).collect()
        });
        assert!(took.iter().all(|&t| t < Duration::from_secs(2)), "{took:?}");
    }

    /// A process that gives up lets no peer join it: the peer, which dials it, hears why
    /// it stopped rather than joining a process that is leaving.
    #[test]
    fn a_process_that_gives_up_lets_no_peer_join_it() {
        let dir = tempfile::tempdir().unwrap();
        let addresses = vec![free(), free()];
        let a = addresses.clone();
        let key = handshake::key(None);
        // Process 1 dials process 0 from the start.
        let second = std::thread::spawn(move || join_at(&a, 1, Duration::from_secs(30), &key));
        std::thread::sleep(Duration::from_millis(100));
        let leaving = process_of(dir.path(), &addresses, 0);
        leaving.give_up_within("state s.json: not a fitted state", Duration::from_secs(2));
        let err = second.join().unwrap().unwrap_err().to_string();
        assert!(
            err.contains("process 0 (") && err.contains("stopped before joining the cluster"),
            "{err}"
        );
    }
}
