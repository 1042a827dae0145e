//! Where a job runs: worker threads in this process, and optionally the processes of a
//! timely cluster — joined here rather than by timely's own start-up, which polls for
//! peers once a second and waits for a missing one forever.

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use timely::WorkerConfig;
use timely::communication::allocator::zero_copy::initialize::initialize_networking_from_sockets;
use timely::communication::allocator::{AllocatorBuilder, ProcessBuilder};
use timely::communication::{Hooks, WorkerGuards};
use timely::worker::Worker;

use super::handshake::{self, ClusterSecret, Greeted, Greeting, HELLO, HELLO_BEAT, NotJoined};
use super::heartbeat::{self, Heartbeat, Signals};
use crate::error::{Error, Result};

/// How long the processes of a cluster wait for one another at start-up.
pub const JOIN_TIMEOUT: Duration = Duration::from_secs(60);

/// How often a process looks for peers while they join.
pub(super) const JOIN_POLL: Duration = Duration::from_millis(10);

/// The most bytes of a hostfile read (a line a process, 256 bytes each for 4,096).
const MAX_HOSTFILE_BYTES: u64 = 1 << 20;

/// Where the dataflow runs: threads in this process, and optionally several processes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cluster {
    /// Worker threads per process.
    pub workers: usize,
    /// Processes in the computation.
    pub processes: usize,
    /// This process's index.
    pub process: usize,
    /// `host:port` per line, one per process (default: localhost from port 2101).
    pub hostfile: Option<PathBuf>,
    /// The secret the processes prove to each other that they hold when they join
    /// (`--cluster-secret-file`); without one, anyone who reaches a cluster port can pose
    /// as a peer.
    pub secret: Option<ClusterSecret>,
}

impl Cluster {
    /// One process with `workers` threads.
    pub fn local(workers: usize) -> Self {
        Cluster {
            workers,
            processes: 1,
            process: 0,
            hostfile: None,
            secret: None,
        }
    }

    /// The address of process `p`: its hostfile line, or the default.
    pub fn address(&self, p: usize) -> String {
        self.addresses()
            .ok()
            .and_then(|a| a.get(p).cloned())
            .unwrap_or_else(|| default_address(p))
    }

    /// Every process's address, by process: the first `processes` lines of the hostfile
    /// (a hostfile may list more hosts than a job uses), blank lines and `#` comments
    /// (whole lines, or the end of one) left out.
    pub fn addresses(&self) -> Result<Vec<String>> {
        let Some(h) = &self.hostfile else {
            return Ok((0..self.processes).map(default_address).collect());
        };
        // A regular file only: a FIFO named by mistake would block here for ever.
        let text = hydrant_operators::read_small_text(h, MAX_HOSTFILE_BYTES)
            .map_err(|e| Error::Usage(format!("hostfile {}: {e}", h.display())))?;
        let lines: Vec<String> = text
            .lines()
            // An address holds no `#`: from one on, a line is a comment.
            .map(|l| l.split('#').next().unwrap_or_default().trim())
            .filter(|l| !l.is_empty())
            .map(String::from)
            .collect();
        if lines.len() < self.processes {
            return Err(Error::Usage(format!(
                "hostfile {} lists fewer than {} hosts",
                h.display(),
                self.processes
            )));
        }
        for (i, line) in lines[..self.processes].iter().enumerate() {
            // Found by a hostile run: port 0 (and a line with no port) was taken, and each
            // process waited the join's minute for the other before blaming it.
            let host_and_port = line.rsplit_once(':').is_some_and(|(host, port)| {
                !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0)
            });
            if !host_and_port {
                return Err(Error::Usage(format!(
                    "hostfile {} lists `{}` for process {i}: an address is HOST:PORT, with a \
                     port from 1 to 65535",
                    h.display(),
                    hydrant_operators::quoted(line)
                )));
            }
            if let Some(j) = lines[..i].iter().position(|l| l == line) {
                return Err(Error::Usage(format!(
                    "hostfile {} lists {line} for processes {j} and {i}: each needs an \
                     address of its own",
                    h.display()
                )));
            }
        }
        Ok(lines[..self.processes].to_vec())
    }

    pub(super) fn check(&self) -> Result<()> {
        let wrong = match () {
            _ if self.workers == 0 => "--workers must be at least 1".to_string(),
            _ if self.processes == 0 => "--processes must be at least 1".to_string(),
            _ if self.process >= self.processes => format!(
                "--process {} is not below --processes {} (processes are numbered from 0)",
                self.process, self.processes
            ),
            _ => return Ok(()),
        };
        Err(Error::Usage(wrong))
    }

    /// Starts `worker` on every worker thread of this process, joined to the other
    /// processes of the cluster first (waiting at most [`JOIN_TIMEOUT`] for them), with
    /// heartbeats to them that record a peer that stops answering as lost (the job then
    /// ends with one line naming it). `signals` reach the peers while it runs (and theirs
    /// are heard); one process has no one to signal.
    pub fn execute<T, F>(&self, signals: Option<&Signals>, worker: F) -> Result<Started<T>>
    where
        T: Send + 'static,
        F: Fn(&mut Worker) -> T + Send + Sync + 'static,
    {
        self.check()?;
        if self.processes == 1 {
            let guards = timely::execute(timely::Config::process(self.workers), worker)
                .map_err(Error::Dataflow)?;
            return Ok(Started {
                guards,
                heartbeat: None,
            });
        }
        let key = handshake::key(self.secret.as_ref());
        let addresses = self.addresses()?;
        let listener = TcpListener::bind(&addresses[self.process])
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .map_err(|e| {
                let (at, p, n) = (&addresses[self.process], self.process, self.processes);
                // A second process `p`: the peers wait for the first, which holds the
                // port. Told that `p` stopped, they would end the job it is joining.
                if e.kind() == std::io::ErrorKind::AddrInUse
                    && handshake::holds_seat(at, (p, n), &key)
                {
                    return Error::Usage(format!(
                        "cannot listen on {at}, process {p}'s address in the hostfile: \
                         process {p} of this cluster is running there already (was it \
                         started twice?)"
                    ));
                }
                // The peers wait for this process: tell them it will not come.
                let e = match e.kind() {
                    std::io::ErrorKind::AddrInUse => Error::Usage(format!(
                        "cannot listen on {at}, process {p}'s address in the hostfile: {e} \
                         (is another process {p} of this cluster running, or another \
                         program on that port?)"
                    )),
                    _ => Error::Usage(format!("cannot listen on {at}: {e}")),
                };
                self.give_up(&e.to_string());
                e
            })?;
        let (sockets, beats) = join(&addresses, self.process, listener, JOIN_TIMEOUT, &key)?;
        let lost: heartbeat::OnLost = std::sync::Arc::new(super::fate::lose_peer);
        let pace = heartbeat::Pace {
            interval: heartbeat::INTERVAL,
            silence: heartbeat::SILENCE,
            // Until a peer is first heard it may still be greeting the others.
            first: JOIN_TIMEOUT,
        };
        let heartbeat = Heartbeat::start(beats, pace, lost, signals.cloned())
            .map_err(|e| Error::Dataflow(format!("cannot start the cluster's heartbeats: {e}")))?;
        let hooks = Hooks::default();
        let threads = ProcessBuilder::new_typed_vector(
            self.workers,
            hooks.refill.clone(),
            hooks.spill.clone(),
        );
        let (builders, comms) =
            initialize_networking_from_sockets(threads, sockets, self.process, self.workers, hooks)
                .map_err(|e| Error::Dataflow(format!("cannot start the cluster's network: {e}")))?;
        let builders = builders.into_iter().map(AllocatorBuilder::Tcp).collect();
        let guards = timely::execute::execute_from(
            builders,
            Box::new(comms),
            WorkerConfig::default(),
            worker,
        )
        .map_err(Error::Dataflow)?;
        Ok(Started {
            guards,
            heartbeat: Some(heartbeat),
        })
    }
}

/// A job running on this process's workers (see [`Cluster::execute`]).
pub struct Started<T: Send + 'static> {
    guards: WorkerGuards<T>,
    heartbeat: Option<Heartbeat>,
}

impl<T: Send + 'static> Started<T> {
    /// Waits for every worker and for the network threads (so that what this process
    /// sent has left it), then tells the peers this process is done (so that its silence
    /// from then on is not taken for a loss). Returns each worker's result, or its panic;
    /// `None` if the network threads failed as they ended (a peer closed its connections
    /// first), which is not a worker's failure: a caller that needs the results takes
    /// them from the workers another way.
    pub fn join(self) -> Option<Vec<std::result::Result<T, String>>> {
        let Started { guards, heartbeat } = self;
        let results = super::fate::quietly(move || guards.join());
        if let Some(heartbeat) = heartbeat {
            heartbeat.finish();
        }
        results
    }

    /// Leaves the workers running, unjoined (they may wait for a failed peer forever, and
    /// joining timely's threads after a failure panics), and stops the heartbeats: the
    /// peers see this process go.
    pub fn abandon(self) {
        std::mem::forget(self.guards);
    }
}

/// How long a join waits before it says what it waits for.
const WAIT_NOTE: Duration = Duration::from_secs(5);

fn default_address(p: usize) -> String {
    format!("localhost:{}", 2101 + p)
}

/// What a join that timed out says of a process when a connection claiming to be it did
/// not prove the secret (it, or a stranger), or when its port did not answer as a peer.
const CLAIMED: &str = "a connection claiming to be it did not prove the cluster's secret \
     (it was started with another --cluster-secret-file or with none, or it was not it)";
const UNANSWERED: &str =
    "its port takes connections but does not answer as a process of a hydrant cluster";

/// A socket per process (`None` at this one's index), as timely's networking wants them.
type Sockets = Vec<Option<TcpStream>>;

/// Connects process `me` to every other, twice (timely's connection and the heartbeats'):
/// it dials the processes before it and accepts the ones after it, each connection
/// greeted with its purpose and the dialer's index, and both sides proving they hold the
/// secret `key` was made from (`handshake.rs`). Returns timely's sockets, and
/// `(process, heartbeat connection)` per peer.
///
/// Greetings are read as they come, all at once: a connection that says nothing (a port
/// scanner, a stranger) is dropped after a second without holding up the others.
fn join(
    addresses: &[String],
    me: usize,
    listener: TcpListener,
    timeout: Duration,
    key: &ring::hmac::Key,
) -> Result<(Sockets, Vec<(usize, TcpStream)>)> {
    let n = addresses.len();
    let mut sockets: Sockets = (0..n).map(|_| None).collect();
    let mut beats: Sockets = (0..n).map(|_| None).collect();
    // What was seen of a process that has not joined: a connection claiming to be it
    // that did not prove the secret, or its port not answering as a peer.
    let mut seen: Vec<Option<&str>> = vec![None; n];
    let mut greeting: Vec<Greeting> = Vec::new();
    let started = Instant::now();
    let deadline = started + timeout;
    let mut told_waiting = false;
    // A greeting of another version of the protocol (which process sent it cannot be
    // known), said beside a timeout.
    let mut other_version = None;
    loop {
        for p in 0..me {
            for (slot, hello) in [(&mut sockets[p], HELLO), (&mut beats[p], HELLO_BEAT)] {
                if slot.is_some() {
                    continue;
                }
                match handshake::dial(&addresses[p], hello, (me, p, n), key) {
                    Ok(stream) => *slot = Some(stream),
                    // (`ItsProofHeld` answers a dial of this process's own seat only.)
                    Err(NotJoined::NotYet | NotJoined::ItsProofHeld) => {}
                    Err(NotJoined::Unanswered) => seen[p] = Some(UNANSWERED),
                    Err(NotJoined::Refused(why)) => {
                        return Err(Error::Usage(format!(
                            "process {me}: process {p} ({}) is not of this cluster: {why}",
                            addresses[p]
                        )));
                    }
                }
            }
        }
        while let Ok((stream, _)) = listener.accept() {
            if stream.set_nonblocking(true).is_ok() {
                greeting.push(Greeting::new(stream));
            }
        }
        for g in std::mem::take(&mut greeting) {
            match g.poll((me, n), key) {
                Greeted::Pending(g) => greeting.push(g),
                Greeted::Peer(HELLO, p, stream) if p > me && p < n => sockets[p] = Some(stream),
                Greeted::Peer(_, p, stream) if p > me && p < n => beats[p] = Some(stream),
                Greeted::Unproved(p) if p < n => seen[p] = Some(CLAIMED),
                Greeted::Gone(p, why) if p < n && p != me => {
                    return Err(Error::Dataflow(format!(
                        "process {me}: process {p} ({}) stopped before joining the cluster: \
                         {why}",
                        addresses[p]
                    )));
                }
                Greeted::OtherSize(p, theirs) if p != me => {
                    let at = addresses
                        .get(p)
                        .map_or(String::new(), |a| format!(" ({a})"));
                    return Err(Error::Usage(format!(
                        "process {me}: process {p}{at} is not of this cluster: {}",
                        handshake::other_size(theirs, n)
                    )));
                }
                Greeted::OtherVersion(theirs) => {
                    other_version = Some(handshake::other_version(&theirs, HELLO));
                }
                Greeted::Peer(..)
                | Greeted::Unproved(_)
                | Greeted::Gone(..)
                | Greeted::OtherSize(..)
                | Greeted::Stranger => {}
            }
        }
        let missing: Vec<usize> = (0..n)
            .filter(|&p| p != me && (sockets[p].is_none() || beats[p].is_none()))
            .collect();
        if missing.is_empty() {
            let beats = beats
                .into_iter()
                .enumerate()
                .filter_map(|(p, s)| Some((p, s?)))
                .collect();
            return Ok((sockets, beats));
        }
        // A process started alone (a missing --hostfile, a peer not launched) says what it
        // waits for, once, rather than nothing until the timeout.
        if !told_waiting && started.elapsed() >= WAIT_NOTE {
            told_waiting = true;
            let who: Vec<String> = missing
                .iter()
                .map(|&p| format!("{p} ({})", addresses[p]))
                .collect();
            hydrant_operators::log_line!(
                "hydrant: process {me}: waiting for process(es) {} to join (at most {} s)",
                who.join(", "),
                timeout.as_secs()
            );
        }
        if Instant::now() >= deadline {
            let who: Vec<String> = missing
                .iter()
                .map(|&p| match seen[p] {
                    Some(what) => format!("{p} ({}: {what})", addresses[p]),
                    None => format!("{p} ({})", addresses[p]),
                })
                .collect();
            let also = other_version.map_or(String::new(), |why| {
                format!("; a process that dialed this one was not of this cluster: {why}")
            });
            return Err(Error::Dataflow(format!(
                "process {me}: process(es) {} did not join the cluster within {} s{also}",
                who.join(", "),
                timeout.as_secs()
            )));
        }
        std::thread::sleep(JOIN_POLL);
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::io::{Read, Write};

    use super::*;

    /// [`join`], listening on this process's address first.
    pub(in crate::runtime) fn join_at(
        addresses: &[String],
        me: usize,
        timeout: Duration,
        key: &ring::hmac::Key,
    ) -> Result<(Sockets, Vec<(usize, TcpStream)>)> {
        let listener = TcpListener::bind(&addresses[me]).unwrap();
        listener.set_nonblocking(true).unwrap();
        join(addresses, me, listener, timeout, key)
    }

    /// A free loopback port below Linux's default ephemeral range (32768-60999): one the
    /// kernel hands out for port 0 can become another test's outgoing source port before
    /// `join` listens on it.
    pub(in crate::runtime) fn free() -> String {
        use std::sync::atomic::{AtomicU32, Ordering};
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let start = std::process::id().wrapping_mul(7919);
        (0..20_000)
            .map(|_| 12_000 + (start + NEXT.fetch_add(1, Ordering::Relaxed)) % 20_000)
            .find(|&port| TcpListener::bind(("127.0.0.1", port as u16)).is_ok())
            .map(|port| format!("127.0.0.1:{port}"))
            .expect("a free port on loopback")
    }

    /// Found by a hostile run: `--process 2 --processes 2` was refused as "need --workers
    /// >= 1 and --process < --processes (got 1, 2, 2)", naming an option not given.
    #[test]
    fn a_cluster_out_of_range_names_the_option() {
        let at = |workers, processes, process| Cluster {
            workers,
            processes,
            process,
            hostfile: None,
            secret: None,
        };
        for (cluster, said) in [
            (
                at(1, 2, 2),
                "--process 2 is not below --processes 2 (processes are numbered",
            ),
            (at(0, 1, 0), "--workers must be at least 1"),
            (at(1, 0, 0), "--processes must be at least 1"),
        ] {
            let e = cluster.check().unwrap_err().to_string();
            assert!(e.contains(said), "{e}");
        }
        assert!(at(2, 2, 1).check().is_ok());
    }

    #[test]
    fn three_processes_join_and_strangers_are_ignored() {
        let addresses: Vec<String> = (0..3).map(|_| free()).collect();
        let start = |me: usize| {
            let a = addresses.clone();
            std::thread::spawn(move || {
                join_at(&a, me, Duration::from_secs(30), &handshake::key(None))
            })
        };
        // Process 0 listens first, and strangers reach it before its peers do: twelve
        // that say nothing (their greetings are read together, not one after the other
        // for a second each), one that says half a greeting, one that says something else.
        let first = start(0);
        let connect = || loop {
            if let Ok(s) = TcpStream::connect(&addresses[0]) {
                break s;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        let _silent: Vec<TcpStream> = (0..12).map(|_| connect()).collect();
        let mut half = connect();
        half.write_all(&HELLO[..5]).unwrap();
        let mut rude = connect();
        rude.write_all(b"GET / HTTP/1.1\r\nHost: hydrant\r\nAccept: */*\r\n\r\n")
            .unwrap();
        std::thread::sleep(Duration::from_millis(100));
        let started = Instant::now();
        let joined = [first, start(1), start(2)];
        for (me, j) in joined.into_iter().enumerate() {
            let (sockets, beats) = j.join().unwrap().unwrap();
            assert_eq!(sockets.len(), 3);
            for (p, s) in sockets.iter().enumerate() {
                assert_eq!(s.is_some(), p != me, "process {me}, socket {p}");
            }
            let peers: Vec<usize> = beats.iter().map(|(p, _)| *p).collect();
            let others: Vec<usize> = (0..3).filter(|&p| p != me).collect();
            assert_eq!(peers, others, "process {me}'s heartbeats");
        }
        let took = started.elapsed();
        assert!(took < Duration::from_secs(3), "joined after {took:?}");
    }

    /// Process 1 started with `--processes 3` dials process 0 started with 2: both end
    /// at once naming the other's size, where both used to wait out the join's timeout.
    #[test]
    fn processes_started_with_different_sizes_say_so_at_once() {
        let addresses: Vec<String> = (0..3).map(|_| free()).collect();
        let two = addresses[..2].to_vec();
        let timeout = Duration::from_secs(30);
        let started = Instant::now();
        let first = std::thread::spawn(move || join_at(&two, 0, timeout, &handshake::key(None)));
        let second = join_at(&addresses, 1, timeout, &handshake::key(None));
        let errors = [first.join().unwrap(), second].map(|r| r.unwrap_err().to_string());
        assert!(
            errors[0].contains("process 1 (")
                && errors[0].contains("--processes 3, and this process with --processes 2"),
            "{}",
            errors[0]
        );
        assert!(
            errors[1].contains("process 0 (")
                && errors[1].contains("--processes 2, and this process with --processes 3"),
            "{}",
            errors[1]
        );
        let took = started.elapsed();
        assert!(took < Duration::from_secs(5), "{took:?}");
    }

    #[test]
    fn a_missing_peer_is_named_after_the_timeout() {
        let addresses = vec![free(), free()];
        let err = join_at(
            &addresses,
            1,
            Duration::from_millis(300),
            &handshake::key(None),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("process(es) 0"), "{err}");
        assert!(err.contains(&addresses[0]), "{err}");
    }

    #[test]
    fn only_holders_of_the_secret_join() {
        let secret = |s: &str| Some(ClusterSecret::new(s.as_bytes()).unwrap());
        let ours = handshake::key(secret("a secret of this cluster").as_ref());
        let addresses = vec![free(), free()];
        let a = addresses.clone();
        let key = ours.clone();
        let first = std::thread::spawn(move || join_at(&a, 0, Duration::from_secs(30), &key));

        // Before process 1 comes, an impostor greets process 0 as process 1, with another
        // secret and with none: refused, and each learns its answer proves nothing to it.
        let wait = Duration::from_secs(2);
        for theirs in [secret("another cluster's secret"), None] {
            let key = handshake::key(theirs.as_ref());
            let err = join_at(&addresses[..], 1, wait, &key)
                .unwrap_err()
                .to_string();
            assert!(err.contains("is not of this cluster"), "{err}");
            assert!(err.contains("did not prove the cluster's secret"), "{err}");
        }
        // A stranger that copies a real greeting cannot finish it without the secret.
        let mut stranger = TcpStream::connect(&addresses[0]).unwrap();
        let mut greeting = HELLO.to_vec();
        greeting.extend_from_slice(&1u64.to_le_bytes());
        greeting.extend_from_slice(&[7; 16]);
        stranger.write_all(&greeting).unwrap();
        stranger
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut answer = [0u8; 64];
        stranger.read_exact(&mut answer).unwrap();
        stranger.write_all(&answer[32..]).unwrap();
        // Dropped (closed) while process 0 still waits, not welcomed as process 1.
        let closed = stranger.read(&mut answer);
        assert!(matches!(closed, Ok(0)), "{closed:?}");

        // Process 1 with the secret joins.
        let (sockets, beats) = join_at(&addresses, 1, Duration::from_secs(30), &ours).unwrap();
        assert!(sockets[0].is_some() && beats.len() == 1);
        let (sockets, beats) = first.join().unwrap().unwrap();
        assert!(sockets[1].is_some() && beats.len() == 1);
    }

    #[test]
    fn a_process_with_another_secret_is_named_by_both() {
        let addresses = vec![free(), free()];
        let a = addresses.clone();
        let ours = handshake::key(Some(&ClusterSecret::new(b"0123456789abcdef").unwrap()));
        let first = std::thread::spawn(move || join_at(&a, 0, Duration::from_millis(1500), &ours));
        let dialer = join_at(
            &addresses,
            1,
            Duration::from_secs(30),
            &handshake::key(None),
        );
        let dialer = dialer.unwrap_err().to_string();
        assert!(dialer.contains("process 0"), "{dialer}");
        assert!(
            dialer.contains("did not prove the cluster's secret"),
            "{dialer}"
        );
        let dialed = first.join().unwrap().unwrap_err().to_string();
        assert!(dialed.contains("process(es) 1"), "{dialed}");
        assert!(
            dialed.contains("did not prove the cluster's secret"),
            "{dialed}"
        );
    }

    /// Process 1's join against a process 0 that is a port answering each connection with
    /// `answer`, waiting at most `timeout`: its error, and how long it took.
    fn join_against(answer: fn(TcpStream), timeout: Duration) -> (String, Duration) {
        let port = TcpListener::bind("127.0.0.1:0").unwrap();
        let at = port.local_addr().unwrap().to_string();
        std::thread::spawn(move || {
            for c in port.incoming().flatten() {
                std::thread::spawn(move || answer(c));
            }
        });
        let started = Instant::now();
        let err = join_at(&[at, free()], 1, timeout, &handshake::key(None));
        (err.unwrap_err().to_string(), started.elapsed())
    }

    #[test]
    fn ports_that_are_not_peers_are_named_and_do_not_stretch_the_join() {
        // A banner (an SSH server, say): refused at its first bytes.
        let (err, took) = join_against(
            |mut c| {
                let _ = c.write_all(b"SSH-2.0-OpenSSH_9.6\r\n");
                std::thread::sleep(Duration::from_secs(30));
            },
            Duration::from_secs(30),
        );
        assert!(
            err.contains("does not answer as a process of a hydrant cluster"),
            "{err}"
        );
        assert!(took < Duration::from_secs(5), "{took:?}");

        // A port that trickles a byte at a time: each dial ends within its 2 s, the join
        // soon after its own deadline, naming what it saw.
        let (err, took) = join_against(
            |mut c| {
                while c.write_all(HELLO).is_ok() {
                    std::thread::sleep(Duration::from_millis(900));
                }
            },
            Duration::from_secs(1),
        );
        assert!(err.contains("does not answer as a process"), "{err}");
        assert!(took < Duration::from_secs(8), "{took:?}");
    }

    #[test]
    fn a_hostfile_that_lists_an_address_twice_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let hosts = dir.path().join("hosts");
        std::fs::write(&hosts, "127.0.0.1:7001\n127.0.0.1:7002\n127.0.0.1:7001\n").unwrap();
        let cluster = Cluster {
            workers: 1,
            processes: 3,
            process: 0,
            hostfile: Some(hosts),
            secret: None,
        };
        let err = cluster.addresses().unwrap_err().to_string();
        assert!(
            err.contains("127.0.0.1:7001 for processes 0 and 2"),
            "{err}"
        );
        let two = Cluster {
            processes: 2,
            ..cluster
        };
        // Only the first two lines are the job's: a join waits for no third process.
        assert_eq!(two.addresses().unwrap().len(), 2);
    }

    #[test]
    fn a_hostfile_line_that_is_not_host_and_port_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let hosts = dir.path().join("hosts");
        for line in ["127.0.0.1:0", "garbage", "node:99999", ":7001", "node:"] {
            std::fs::write(&hosts, format!("127.0.0.1:7001\n{line}\n")).unwrap();
            let cluster = Cluster {
                workers: 1,
                processes: 2,
                process: 0,
                hostfile: Some(hosts.clone()),
                secret: None,
            };
            let err = cluster.addresses().unwrap_err().to_string();
            assert!(
                err.contains(&format!("`{line}` for process 1")) && err.contains("HOST:PORT"),
                "{err}"
            );
        }
    }

    #[test]
    fn a_hostfile_s_comments_and_blank_lines_are_not_hosts() {
        let dir = tempfile::tempdir().unwrap();
        let hosts = dir.path().join("hosts");
        let text = "# the job's nodes\n\n  node-a:7001\n# node-b is down\nnode-c:7001  # rack 2\n";
        std::fs::write(&hosts, text).unwrap();
        let cluster = Cluster {
            workers: 1,
            processes: 2,
            process: 0,
            hostfile: Some(hosts),
            secret: None,
        };
        assert_eq!(cluster.addresses().unwrap(), ["node-a:7001", "node-c:7001"]);
    }
}
