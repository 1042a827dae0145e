//! `hydrant serve`: the pipeline over Arrow Flight, from files or pushed input.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use hydrant::runtime;
use hydrant::{Error, PipelineSpec, Result};
use serde_json::json;

use hydrant::read_state;

use super::{Common, DeliveryArgs, prepare, round3};

#[derive(Args, Clone)]
pub(crate) struct ServeArgs {
    #[command(flatten)]
    common: Common,
    /// A fitted state from `hydrant fit`; without it, the server fits first.
    #[arg(long)]
    state: Option<PathBuf>,
    /// Address to listen on (port 0: any free port; the chosen one is printed). Each
    /// process of a cluster listens on its own.
    #[arg(long, default_value = "127.0.0.1:50051")]
    listen: String,
    /// With --processes > 1: the HOST:PORT trainers reach this process at, which
    /// GetFlightInfo names as the location of its ranks (default: the --listen address).
    #[arg(long, value_name = "HOST:PORT", value_parser = host_port)]
    advertise: Option<String>,
    /// `user:password [roles]` lines (roles: a comma list of train, ingest, admin; all when
    /// left out); clients then authenticate (Basic, then a bearer token per login).
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// How long a bearer token lives after its login: seconds, or with a unit (`90s`,
    /// `30m`, `24h`, `7d`).
    #[arg(long, default_value = "24h", value_parser = parse_ttl)]
    token_ttl: Duration,
    /// Listen on a non-loopback address without a token file (and serve metrics, which
    /// have no auth, on one).
    #[arg(long)]
    insecure_listen_any: bool,
    /// Serve over TLS with this PEM certificate (chain); needs --tls-key.
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Send tokens and passwords in clear on a non-loopback address (without TLS).
    #[arg(long)]
    insecure_plaintext: bool,
    /// Largest message the server accepts, in bytes.
    #[arg(long, default_value_t = 64 << 20, value_parser = super::int_in(1 << 10, i32::MAX as usize))]
    max_message_bytes: usize,
    /// MiB of sent batches kept per rank for trainers that reconnect (an older step is
    /// served by a new run).
    #[arg(long, default_value_t = 24, value_parser = super::int_in(0usize, 1 << 16))]
    replay_mib: usize,
    /// Seconds a run no trainer reads is kept (its batches and threads are then let go; a
    /// trainer that comes back later is served by a new run).
    #[arg(long, default_value_t = 300, value_parser = super::int_in(1u64, 7 * 86_400))]
    idle_timeout: u64,
    /// Seconds a trainer's stream waits for its next batch before the ranks that no one
    /// reads, of its epoch and earlier ones and on every process of a cluster, are let go
    /// (so that one rank read alone does not wait forever); such a rank, read later,
    /// catches up on a run of its own.
    #[arg(long, default_value_t = 3, value_parser = super::int_in(1u64, 86_400))]
    absent_after: u64,
    /// With pushed input (`input = "flight"`): spool each accepted batch here, synced to
    /// disk before it is acknowledged; a server restarted with the same folder delivers
    /// them again, in the same steps, from the trainers' last `commit` on. Without it,
    /// pushed input is at-most-once.
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// Stream the Parquet / Arrow IPC files that appear in DIR (instead of --input): one
    /// endless epoch, files admitted in name order as they appear; names starting with `_`
    /// or `.` are not data. Needs --state, or [stats] mode = "refresh". With --state-dir, admissions are recorded there
    /// and a restarted server replays them from the trainers' last `commit`.
    #[arg(long, value_name = "DIR")]
    follow: Option<PathBuf>,
    /// The spool's segments grow to this many MiB; a commit deletes the segments wholly
    /// before the rows its step needs.
    #[arg(long, default_value_t = hydrant::serve::SEGMENT_BYTES >> 20,
          value_parser = super::int_in(1u64, 1 << 20))]
    spool_segment_mib: u64,
    /// Export Prometheus metrics at http://HOST:PORT/metrics.
    #[arg(long)]
    metrics_listen: Option<std::net::SocketAddr>,
    #[command(flatten)]
    delivery: DeliveryArgs,
}

/// What `serve` checks, reads and binds before a cluster's processes join: a failure here
/// is told to the peers ([`super::told_peers`]).
struct Opened {
    addr: std::net::SocketAddr,
    auth: Option<hydrant_flight::Auth>,
    spec: PipelineSpec,
    listener: std::net::TcpListener,
    local: std::net::SocketAddr,
    pushed: bool,
    /// The certificate and key, as read (checked as TLS when the server is made).
    tls: Option<(Vec<u8>, Vec<u8>)>,
    /// This process's Flight location, in a cluster.
    here: Option<String>,
}

fn open(args: &ServeArgs) -> Result<Opened> {
    let addr: std::net::SocketAddr = args
        .listen
        .parse()
        .map_err(|e| Error::Usage(format!("--listen {}: {e}", args.listen)))?;
    if !addr.ip().to_canonical().is_loopback()
        && args.token_file.is_none()
        && !args.insecure_listen_any
    {
        return Err(Error::Usage(format!(
            "--listen {addr} is not loopback: give --token-file, or --insecure-listen-any"
        )));
    }
    if !addr.ip().to_canonical().is_loopback()
        && args.token_file.is_some()
        && args.tls_cert.is_none()
        && !args.insecure_plaintext
    {
        return Err(Error::Usage(format!(
            "--listen {addr} is not loopback: passwords and tokens would cross the network in \
             clear; give --tls-cert and --tls-key, or --insecure-plaintext"
        )));
    }
    if let Some(m) = args.metrics_listen
        && !m.ip().to_canonical().is_loopback()
        && !args.insecure_listen_any
    {
        return Err(Error::Usage(format!(
            "--metrics-listen {m} is not loopback and metrics have no auth: give \
             --insecure-listen-any to serve them there anyway"
        )));
    }
    let auth = match &args.token_file {
        Some(path) => Some(
            hydrant_flight::Auth::from_file(path)
                .map_err(|e| Error::Usage(e.to_string()))?
                .with_ttl(args.token_ttl),
        ),
        None => None,
    };
    let spec = PipelineSpec::from_file(&args.common.pipeline)?;
    if args.follow.is_some() && spec.input == hydrant::InputKind::Flight {
        return Err(Error::Usage(format!(
            "pipeline `{}` takes pushed input (input = \"flight\"); it cannot also --follow",
            spec.name
        )));
    }
    // Bound before anything else, so that a cluster can tell its processes the port
    // (port 0 included) and a taken port fails at once.
    let listener = std::net::TcpListener::bind(addr)
        .and_then(|l| l.set_nonblocking(true).map(|()| l))
        .map_err(|e| Error::Usage(format!("--listen {addr}: {e}")))?;
    let local = listener
        .local_addr()
        .map_err(|e| Error::Usage(format!("--listen {addr}: {e}")))?;
    let pushed = spec.input == hydrant::InputKind::Flight || args.follow.is_some();
    if spec.stats.refreshes() && !pushed {
        return Err(Error::Usage(format!(
            "pipeline `{}` refreshes its statistics ([stats] mode = \"refresh\"), which \
             streams do: push its input (input = \"flight\") or give --follow",
            spec.name
        )));
    }
    if pushed && args.common.processes > 1 {
        return Err(Error::Usage(format!(
            "pipeline `{}` takes pushed or followed input, which one process serves: give \
             --processes 1",
            spec.name
        )));
    }
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => {
            let read = |flag: &str, path: &PathBuf| {
                hydrant::operators::read_small_file(path, 1 << 20)
                    .map_err(|e| Error::Usage(format!("{flag} {}: {e}", path.display())))
            };
            let (cert, key) = (read("--tls-cert", cert)?, read("--tls-key", key)?);
            // Checked now, not once the cluster has joined: peers then only lose a process.
            hydrant_flight::check_tls(&cert, &key)
                .map_err(|e| Error::Usage(format!("--tls-cert/--tls-key: {e}")))?;
            Some((cert, key))
        }
        _ => None,
    };
    let here = match args.common.processes {
        1 => None,
        _ => Some(location(args, local)?),
    };
    Ok(Opened {
        addr,
        auth,
        spec,
        listener,
        local,
        pushed,
        tls,
        here,
    })
}

/// The scheme of a Flight location (`grpc` or `grpc+tls`).
fn scheme_of(location: &str) -> &str {
    location.split_once("://").map_or("", |(scheme, _)| scheme)
}

/// Runs the server until SIGINT or SIGTERM.
pub(crate) fn serve(args: &ServeArgs) -> Result<()> {
    let started = Instant::now();
    // Until this process has joined its cluster, a failure is told to the peers waiting
    // for it, so that they stop at once rather than after the join's timeout.
    let told = |e: Error| super::told_peers(&args.common, e);
    let Opened {
        addr,
        auth,
        spec,
        listener,
        local,
        pushed,
        tls,
        here,
    } = open(args).map_err(told)?;
    // What a trainer may do must not depend on the process it reads from: a process
    // without --token-file would hand anyone the ranks the others guard.
    let guarded = (
        "--token-file (users and roles) / --token-ttl",
        auth.as_ref()
            .map_or("none (no --token-file)".to_string(), |a| a.summary()),
    );
    // A thread a core (tokio's default; TOKIO_WORKER_THREADS sets another number): the
    // socket copies of every stream's messages are made on these threads, and a fixed
    // two capped a server of many streams at two cores.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| {
            told(Error::Usage(format!(
                "cannot start the server runtime: {e}"
            )))
        })?;
    // Listening from now on: until the pipeline is ready (a state fitted, a cluster
    // joined) handshakes are answered and every other call is UNAVAILABLE, saying why,
    // rather than left waiting on a port no one answers.
    hydrant_flight::quiet_decoder_panics();
    let (mut server, ready) = hydrant_flight::FlightServer::starting(auth, args.max_message_bytes);
    if let Some((cert, key)) = &tls {
        server = server
            .with_tls(cert, key)
            .map_err(|e| told(Error::Usage(format!("--tls-cert/--tls-key: {e}"))))?;
    }
    // Told to close by the task that watches for a signal or a failed cluster; closed
    // too if this function returns early (its sender dropped).
    let (close_tx, mut close) = tokio::sync::watch::channel(false);
    let serving = {
        let _inside = runtime.enter();
        let listener = tokio::net::TcpListener::from_std(listener)
            .map_err(|e| told(Error::Usage(format!("--listen {addr}: {e}"))))?;
        runtime.spawn(server.serve(listener, async move {
            let _ = close.wait_for(|c| *c).await;
        }))
    };
    let metrics_at = match args.metrics_listen {
        Some(m) => {
            let _inside = runtime.enter();
            Some(hydrant::metrics::export(m).map_err(told)?.to_string())
        }
        None => None,
    };
    let mut on_cluster = None;
    let served = if pushed {
        let follows = args.follow.is_some();
        let state = args.state.as_deref();
        streamed_pipeline(spec.clone(), &args.common, state, &args.delivery, follows)?
    } else {
        let pipeline =
            prepare(&args.common, args.state.as_deref(), Some(&args.delivery)).map_err(told)?;
        crate::warn_padding(pipeline.epoch_plan());
        let cluster = pipeline.cluster().clone();
        let job = pipeline.into_job();
        let (inputs, plan, delivery) = (job.inputs.clone(), job.plan.clone(), job.delivery.clone());
        let state = match job.state.clone() {
            Some(s) => s,
            None => {
                let report = runtime::execute(job, &cluster, || {})?;
                report
                    .state
                    .ok_or_else(|| Error::Dataflow("no worker fitted".into()))?
            }
        };
        if let Some(here) = here {
            // Every process's Flight location, told through the cluster with what it
            // serves: processes that serve other jobs would deliver garbage together.
            let job = (&*inputs, &*plan, &state, &delivery);
            let ours = scheme_of(&here).to_string();
            let locations = runtime::same_served(&cluster, job, vec![guarded], here)?;
            // A cluster half over TLS would have trainers send tokens in clear to the rest.
            if let Some((p, theirs)) = locations
                .iter()
                .enumerate()
                .find(|(_, l)| scheme_of(l) != ours)
            {
                return Err(Error::Usage(format!(
                    "process {p} of the cluster serves at {theirs}, and this one over \
                     {ours}: start every process with --tls-cert/--tls-key, or none"
                )));
            }
            on_cluster = Some((cluster.clone(), locations));
        }
        hydrant::serve::ServedPipeline::new(
            &spec.name,
            inputs,
            plan,
            state,
            delivery,
            cluster.workers,
        )?
    }
    .with_replay_bytes(args.replay_mib << 20)
    .with_idle_timeout(Duration::from_secs(args.idle_timeout))
    .with_absent_after(Duration::from_secs(args.absent_after));
    let served = match on_cluster {
        Some((cluster, locations)) => {
            let _inside = runtime.enter();
            served.on_cluster(cluster, locations)?
        }
        None => served.warmed()?,
    };
    let served = match (&args.follow, &args.state_dir) {
        (Some(folder), state_dir) => served.follow(folder, state_dir.as_deref())?,
        (None, Some(dir)) => {
            if !pushed {
                hydrant::operators::log_line!(
                    "hydrant: warning: --state-dir is for pushed or followed input; pipeline \
                     `{}` reads files, which are replayed from themselves: it is not used",
                    spec.name
                );
            }
            served.with_state_dir(dir, args.spool_segment_mib << 20)?
        }
        (None, None) => {
            if spec.input == hydrant::InputKind::Flight {
                hydrant::operators::log_line!(
                    "hydrant: pushed input is at-most-once without --state-dir: rows \
                     acknowledged but not yet delivered are lost if the server stops"
                );
            }
            served
        }
    };
    let served = Arc::new(served);
    let fit_s = started.elapsed().as_secs_f64();
    let (world_size, epochs, steps, rows, local_ranks) = {
        use hydrant_flight::Served;
        let s = served.status();
        (
            served.world_size(),
            served.epochs(),
            s["steps_per_epoch"].clone(),
            s["rows_per_epoch"].clone(),
            s["local_ranks"].clone(),
        )
    };
    ready.serve(vec![served.clone()]);
    let outcome = runtime.block_on(async move {
        let ready = json!({
            "listening": local.to_string(),
            "metrics": metrics_at,
            "process": args.common.process,
            "local_ranks": local_ranks,
            "pipeline": spec.name,
            "world_size": world_size,
            "epochs": epochs,
            "steps_per_epoch": steps,
            "rows_per_epoch": rows,
            "ready_s": round3(fit_s),
        });
        // A stdout no one reads (`hydrant serve | true`) loses the line, not the server.
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        if let Err(e) = writeln!(out, "{ready}").and_then(|()| out.flush()) {
            hydrant::operators::log_line!("hydrant: cannot write the ready line ({e}); serving");
        }
        drop(out);
        // On SIGINT/SIGTERM stop accepting calls and let streams finish, but not forever:
        // a stream can wait on a rank no one reads.
        let (failed, closed) = (served.clone(), served.clone());
        tokio::spawn(async move {
            let mut every = tokio::time::interval(served.sweep_every());
            loop {
                every.tick().await;
                // Closing a run is quick (it cancels tokens); its threads end on their own.
                served.sweep();
            }
        });
        // Whether SIGINT/SIGTERM has come: every wait below looks at this one channel.
        let (stop_tx, stop) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            shutdown_signal().await;
            closed.shutting_down();
            let _ = stop_tx.send(true);
        });
        let stopped = |mut stop: tokio::sync::watch::Receiver<bool>| async move {
            // An error: the signal task is gone without a signal, so none will come.
            if stop.wait_for(|s| *s).await.is_err() {
                std::future::pending::<()>().await;
            }
        };
        // Closing starts on a signal, or once the cluster failed: then each open stream
        // ends with the failure (UNAVAILABLE for a lost peer), not a cut connection.
        let (lost_tx, mut lost) = tokio::sync::watch::channel(None::<String>);
        {
            let stop = stop.clone();
            tokio::spawn(async move {
                tokio::select! {
                    () = stopped(stop) => {}
                    why = failed.cluster_failed() => {
                        let _ = lost_tx.send(Some(why));
                    }
                }
                let _ = close_tx.send(true);
            });
        }
        let served = tokio::select! {
            served = serving => match served {
                Ok(served) => served
                    .map_err(|e| Error::Usage(format!("server: {}", hydrant::error_line(&e)))),
                Err(e) => Err(Error::Usage(format!("server: {e}"))),
            },
            _ = async {
                stopped(stop.clone()).await;
                tokio::time::sleep(Duration::from_secs(5)).await;
            } => {
                hydrant::operators::log_line!("hydrant: streams still open after 5 s; closing them");
                Ok(())
            }
            // A failed cluster's streams end with the failure at once, but its status
            // reaches a trainer only after the steps sent before it, which a slow trainer
            // may still be reading (gRPC's window and the socket's buffers hold megabytes):
            // they are given as long as on a signal, and then cut (without a line of
            // their own: the failure is this process's one line).
            _ = async {
                if lost.wait_for(Option::is_some).await.is_err() {
                    std::future::pending::<()>().await;
                }
                tokio::time::sleep(Duration::from_secs(5)).await;
            } => Ok(()),
        };
        // The cluster shares its fate: a lost peer ends every process, with one line;
        // unless this process is being stopped too (a cluster's processes stopped
        // together see each other go; the signals may reach them a moment apart).
        let why = lost.borrow().clone();
        match why {
            Some(why) => match tokio::time::timeout(Duration::from_secs(1), stopped(stop)).await {
                Ok(()) => Ok(()),
                Err(_) => Err(Error::Dataflow(why)),
            },
            None => served,
        }
    });
    // A producer's DoPut may still wait for queue space on a blocking thread that no
    // trainer will ever free: dropping the runtime would wait for it forever.
    runtime.shutdown_timeout(Duration::from_secs(1));
    outcome
}

/// This process's Flight location as its cluster's peers tell trainers: `grpc://` (or
/// `grpc+tls://`) and `--advertise`, or the address it listens on, which must then be one
/// a trainer can reach.
fn location(args: &ServeArgs, local: std::net::SocketAddr) -> Result<String> {
    let scheme = if args.tls_cert.is_some() {
        "grpc+tls"
    } else {
        "grpc"
    };
    match &args.advertise {
        Some(a) => Ok(format!("{scheme}://{a}")),
        None if local.ip().is_unspecified() => Err(Error::Usage(format!(
            "--listen {local} names no host trainers can reach: give --advertise HOST:PORT"
        ))),
        None => Ok(format!("{scheme}://{local}")),
    }
}

/// `text` if it is `HOST:PORT` as a Flight location names it (`grpc://HOST:PORT`, which
/// every process's GetFlightInfo hands trainers, so that one bad value would break them
/// all): a host name, an IPv4 address or a bracketed IPv6 one, and a port from 1.
fn host_port(text: &str) -> std::result::Result<String, String> {
    let bad = |why: &str| Err(format!("`{text}`: {why}; expected HOST:PORT"));
    let Some((host, port)) = text.rsplit_once(':') else {
        return bad("no port");
    };
    if !matches!(port.parse::<u16>(), Ok(p) if p >= 1) || !port.bytes().all(|b| b.is_ascii_digit())
    {
        return bad("the port is not a number from 1 to 65535");
    }
    let name = |h: &str| {
        h.len() <= 253
            && h.split('.').all(|label| {
                (1..=63).contains(&label.len())
                    && !label.starts_with('-')
                    && !label.ends_with('-')
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            })
    };
    let ok = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(v6) => v6.parse::<std::net::Ipv6Addr>().is_ok(),
        None => host.parse::<std::net::Ipv4Addr>().is_ok() || name(host),
    };
    if !ok {
        return bad("the host is not a host name, an IPv4 address or a bracketed IPv6 one");
    }
    Ok(text.to_string())
}

/// `90`, `90s`, `30m`, `24h` or `7d` as a duration of at least a second.
fn parse_ttl(text: &str) -> std::result::Result<Duration, String> {
    let (digits, unit) = text.split_at(
        text.find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len()),
    );
    let scale = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => {
            return Err(format!(
                "`{text}`: expected seconds, or a number with s, m, h or d"
            ));
        }
    };
    match digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(scale))
    {
        Some(secs) if (1..=hydrant_flight::MAX_TTL.as_secs()).contains(&secs) => {
            Ok(Duration::from_secs(secs))
        }
        _ => Err(format!(
            "`{text}`: expected a whole number of seconds from 1 to {} (365d)",
            hydrant_flight::MAX_TTL.as_secs()
        )),
    }
}

/// Resolves on SIGINT or SIGTERM.
pub(crate) async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(t) => t,
                Err(_) => return ctrl_c.await.unwrap_or(()),
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    ctrl_c.await.unwrap_or(());
    hydrant::operators::log_line!("hydrant: shutting down");
}

/// A pipeline whose input is pushed over Flight or read from a followed folder (`follows`):
/// takes no files, and needs a state unless its statistics are refreshed.
pub(crate) fn streamed_pipeline(
    spec: PipelineSpec,
    common: &Common,
    state: Option<&std::path::Path>,
    d: &DeliveryArgs,
    follows: bool,
) -> Result<hydrant::serve::ServedPipeline> {
    let input = &common.input;
    let what = match follows {
        true => "follows a folder (--follow)",
        false => "takes pushed input (input = \"flight\")",
    };
    if !input.is_empty() {
        return Err(Error::Usage(format!(
            "pipeline `{}` {what}: give no --input",
            spec.name
        )));
    }
    if (d.epochs, d.start_epoch, d.start_step) != (1, 0, 0) {
        return Err(Error::Usage(format!(
            "pipeline `{}` {what}: its rows are one endless stream, so --epochs, \
             --start-epoch and --start-step do not apply (a trainer resumes with its \
             ticket's start_step)",
            spec.name
        )));
    }
    let path = state;
    if path.is_none() && !spec.stats.refreshes() {
        return Err(Error::Usage(format!(
            "pipeline `{}` {what}: give --state, or fit its first state on the first rows \
             with [stats] mode = \"refresh\" in the pipeline file",
            spec.name
        )));
    }
    let state = path.map(read_state).transpose()?;
    let options = d.options(hydrant::runtime::Cluster::local(1))?;
    options.check_memory(&spec.plan(&spec.nominal_schema())?.output_schema())?;
    let plan = hydrant::delivery::EpochPlan::new(
        Vec::new(),
        options.ranks,
        options.batch_size,
        options.last_batch,
        options.seed,
        options.shuffle,
    )?;
    let delivery = hydrant::delivery::Delivery {
        plan: Arc::new(plan),
        epochs: 1,
        start_epoch: 0,
        start_step: 0,
        only: None,
    };
    // Rows are featurized as they are admitted (by each DoPut, or the follower); the
    // dataflow only places and assembles them. A second worker did not help on 2 cores
    // (1M pushed Criteo rows, 2 ranks, 5 alternated runs: 834 against 798 MB/s in order,
    // 776 against 759 shuffled), so one unless --workers says otherwise.
    let workers = super::workers(common, Some(1));
    hydrant::serve::ServedPipeline::ingest(spec, state, delivery, workers).map_err(|e| {
        match (e, path) {
            (Error::Op(op), Some(path)) => Error::State {
                path: path.to_path_buf(),
                reason: op.to_string(),
            },
            (other, _) => other,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advertised_addresses_must_be_locations_a_trainer_can_parse() {
        for good in [
            "node-3.cluster.local:50051",
            "10.0.0.7:1",
            "[::1]:8815",
            "trainer_0:9",
        ] {
            assert_eq!(host_port(good).as_deref(), Ok(good));
        }
        for bad in [
            "bad host:%%",
            "bad host:80",
            "bogus-no-port",
            "h:0",
            "h:65536",
            "h:+80",
            "[::1:80",
            "::1:80",
            "-h:80",
            ":80",
            "a..b:80",
        ] {
            let e = host_port(bad).unwrap_err();
            assert!(e.starts_with(&format!("`{bad}`")), "{e}");
        }
    }
}
