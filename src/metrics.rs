//! Metric names, in one place. Recorded through the `metrics` crate; `hydrant serve
//! --metrics-listen HOST:PORT` exports them for Prometheus.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{ALLOW, CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

/// Counter: featurized rows leaving the dataflow's sinks (label `stage`).
pub const ROWS_OUT: &str = "hydrant_rows_out_total";
/// Counter: rows admitted to a stream (pushed by producers, or read from followed files).
pub const ADMITTED_ROWS: &str = "hydrant_admitted_rows_total";
/// Histogram (seconds): from an admission (a followed file, or a pushed batch) to the
/// first batch delivered at or past its first row.
pub const ADMISSION_TO_DELIVERY: &str = "hydrant_admission_to_delivery_seconds";
/// Gauge (seconds): how old the newest event of the latest delivered admission was when it
/// was delivered (pipelines that name an `event_time` column).
pub const EVENT_TIME_LAG: &str = "hydrant_event_time_lag_seconds";
/// Counter: state versions made by a refreshed stream (`[stats] mode = "refresh"`).
pub const STATE_VERSIONS: &str = "hydrant_state_versions_total";
/// Counter: refreshed parameters whose statistics overflowed, kept as the version before
/// had them from then on.
pub const STATS_OVERFLOWED: &str = "hydrant_stats_overflowed_total";
/// Counter: pushed batches rejected (label `reason`).
pub const PUSH_REJECTED: &str = "hydrant_push_rejected_total";
/// Counter: followed files skipped (wholly or from a bad batch on).
pub const FOLLOW_SKIPPED: &str = "hydrant_follow_skipped_files_total";
/// Counter: batches sent to a rank over Flight (label `rank`).
pub const RANK_BATCHES: &str = "hydrant_rank_batches_total";
/// Counter: bytes of the batches sent to a rank (label `rank`).
pub const RANK_BYTES: &str = "hydrant_rank_bytes_total";
/// Histogram (exported as a summary): each wait of a rank's stream for its next batch,
/// in seconds (label `rank`). Its `_sum` is the time waited so far, a counter in float
/// seconds, which the `metrics` crate's integer counters cannot hold.
pub const RANK_STALL_SECONDS: &str = "hydrant_rank_stall_seconds";
/// Gauge: batches queued for a rank (label `rank`).
pub const RANK_QUEUE_DEPTH: &str = "hydrant_rank_queue_depth";

/// How long a scrape's connection may take, its request included: an idle or slow
/// connection is closed after it, so that idle connections cannot pile up.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(10);
/// How often histograms are drained ([`PrometheusHandle::run_upkeep`]).
const UPKEEP: Duration = Duration::from_secs(5);

/// Starts the Prometheus exporter on `addr` on the current tokio runtime, serving
/// `/metrics` (and `/health`), and returns the address it listens on (`addr` with port 0
/// gets one from the system).
///
/// Served here rather than by the exporter crate's own listener, which keeps an idle
/// connection open for ever and retries a failed accept at once: 1,100 idle connections
/// used up the file descriptors and kept both cores busy retrying.
pub fn export(addr: SocketAddr) -> crate::Result<SocketAddr> {
    let usage =
        |e: &dyn std::fmt::Display| crate::Error::Usage(format!("--metrics-listen {addr}: {e}"));
    let listener = std::net::TcpListener::bind(addr).map_err(|e| usage(&e))?;
    let local = listener.local_addr().map_err(|e| usage(&e))?;
    listener.set_nonblocking(true).map_err(|e| usage(&e))?;
    let listener = tokio::net::TcpListener::from_std(listener).map_err(|e| usage(&e))?;
    let handle = PrometheusBuilder::new()
        .install_recorder()
        .map_err(|e| usage(&e))?;
    describe();
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(UPKEEP);
        loop {
            every.tick().await;
            upkeep.run_upkeep();
        }
    });
    tokio::spawn(serve(listener, handle));
    Ok(local)
}

/// Gives every metric its `# HELP` line, and the counters without labels their 0, so that a
/// scrape before any rows (and `rate()` over the first ones) sees them. Labelled series
/// (a rank's, a reason's) appear with their first value.
fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        ROWS_OUT,
        "Featurized rows leaving the dataflow's sinks, by stage."
    );
    describe_counter!(
        ADMITTED_ROWS,
        "Rows admitted to a stream: pushed, or read from followed files."
    );
    describe_histogram!(
        ADMISSION_TO_DELIVERY,
        Unit::Seconds,
        "From an admission (a followed file, a pushed batch) to the first batch delivered at or past its first row."
    );
    describe_gauge!(
        EVENT_TIME_LAG,
        Unit::Seconds,
        "How old the newest event of the latest delivered admission was when delivered."
    );
    describe_counter!(
        STATE_VERSIONS,
        "State versions made by refreshed statistics."
    );
    describe_counter!(
        STATS_OVERFLOWED,
        "Refreshed parameters whose statistics overflowed, kept at their version before."
    );
    describe_counter!(PUSH_REJECTED, "Pushed batches rejected, by reason.");
    describe_counter!(
        FOLLOW_SKIPPED,
        "Followed files skipped, wholly or from a bad batch on."
    );
    describe_counter!(RANK_BATCHES, "Batches sent to a rank over Flight.");
    describe_counter!(
        RANK_BYTES,
        Unit::Bytes,
        "Bytes of the batches sent to a rank over Flight."
    );
    describe_histogram!(
        RANK_STALL_SECONDS,
        Unit::Seconds,
        "Each wait of a rank's stream for its next batch (_sum: seconds waited in all)."
    );
    describe_gauge!(RANK_QUEUE_DEPTH, "Batches queued for a rank.");
    for name in [
        ADMITTED_ROWS,
        STATE_VERSIONS,
        STATS_OVERFLOWED,
        FOLLOW_SKIPPED,
    ] {
        metrics::counter!(name).absolute(0);
    }
}

/// Answers scrapes on `listener`, one short-lived connection at a time each.
async fn serve(listener: tokio::net::TcpListener, handle: PrometheusHandle) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(_) => {
                tokio::time::sleep(hydrant_flight::ACCEPT_PAUSE).await;
                continue;
            }
        };
        let handle = handle.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request| {
                std::future::ready(Ok::<_, std::convert::Infallible>(answer(&handle, &request)))
            });
            let connection = http1::Builder::new()
                .keep_alive(false)
                .serve_connection(TokioIo::new(stream), service);
            let _ = tokio::time::timeout(CONNECTION_TIMEOUT, connection).await;
        });
    }
}

/// The answer to one request: the metrics, a health check, 404 for another path, or 405
/// for a method other than GET and HEAD (both paths only read).
fn answer<B>(handle: &PrometheusHandle, request: &Request<B>) -> Response<Full<Bytes>> {
    let read = matches!(*request.method(), Method::GET | Method::HEAD);
    let (status, body, kind) = match request.uri().path() {
        _ if !read => (
            StatusCode::METHOD_NOT_ALLOWED,
            "method not allowed: metrics are read with GET\n".to_string(),
            "text/plain",
        ),
        "/metrics" => (StatusCode::OK, handle.render(), "text/plain; version=0.0.4"),
        "/health" => (StatusCode::OK, "OK".to_string(), "text/plain"),
        _ => (
            StatusCode::NOT_FOUND,
            "not found: metrics are at /metrics\n".to_string(),
            "text/plain",
        ),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(kind));
    if !read {
        headers.insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_metrics_and_health_paths_are_answered() {
        let handle = PrometheusBuilder::new().build_recorder().handle();
        let get = |path: &str| {
            let request = Request::builder().uri(path).body(()).unwrap();
            answer(&handle, &request).status()
        };
        assert_eq!(get("/metrics"), StatusCode::OK);
        assert_eq!(get("/health"), StatusCode::OK);
        assert_eq!(get("/nope"), StatusCode::NOT_FOUND);
        assert_eq!(get("/"), StatusCode::NOT_FOUND);
        for method in [Method::DELETE, Method::POST, Method::PUT] {
            let request = Request::builder()
                .method(method.clone())
                .uri("/metrics")
                .body(())
                .unwrap();
            let response = answer(&handle, &request);
            assert_eq!(
                response.status(),
                StatusCode::METHOD_NOT_ALLOWED,
                "{method}"
            );
            assert_eq!(response.headers()[ALLOW], "GET, HEAD");
        }
    }
}
