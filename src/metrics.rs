//! Metric names, in one place. Recorded through the `metrics` crate; `hydrant serve
//! --metrics-listen HOST:PORT` exports them for Prometheus.

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
/// Counter: pushed batches rejected (label `reason`).
pub const PUSH_REJECTED: &str = "hydrant_push_rejected_total";
/// Counter: followed files skipped (wholly or from a bad batch on).
pub const FOLLOW_SKIPPED: &str = "hydrant_follow_skipped_files_total";
/// Counter: batches sent to a rank over Flight (label `rank`).
pub const RANK_BATCHES: &str = "hydrant_rank_batches_total";
/// Counter: bytes of the batches sent to a rank (label `rank`).
pub const RANK_BYTES: &str = "hydrant_rank_bytes_total";
/// Gauge, only ever increased (the `metrics` crate's counters are integers): seconds a
/// rank's stream waited for its next batch (label `rank`).
pub const RANK_STALL_SECONDS: &str = "hydrant_rank_stall_seconds_total";
/// Gauge: batches queued for a rank (label `rank`).
pub const RANK_QUEUE_DEPTH: &str = "hydrant_rank_queue_depth";

/// Starts the Prometheus exporter on `addr` (serving `/metrics`).
pub fn export(addr: std::net::SocketAddr) -> crate::Result<()> {
    metrics_exporter_prometheus::PrometheusBuilder::new()
        .with_http_listener(addr)
        .install()
        .map_err(|e| crate::Error::Usage(format!("--metrics-listen {addr}: {e}")))
}
