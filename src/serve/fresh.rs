//! How fresh a stream's delivered rows are (followed or pushed input): the time from an
//! admission — a followed file, or a pushed batch — to the first batch delivered at or
//! past its first row, and, when the pipeline names an `event_time` column, how old the
//! newest event of the rows just delivered is.
//!
//! Admissions wait in a bounded queue in stream order. Delivery only compares its batch's
//! end position with the oldest waiting admission's first row (two atomics), so the lock
//! is taken once per admission, not once per batch.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use arrow::array::{Array, RecordBatch, TimestampMicrosecondArray};
use arrow::compute::{cast, max};
use arrow::datatypes::{DataType, TimeUnit};

use super::run::lock;

/// Admissions waiting for delivery, at most: beyond, new ones are not timed (counted).
const WAITING: usize = 4096;

/// Latencies kept for the quantiles `status` reports.
const KEPT: usize = 1024;

/// One admission waiting for its first delivered row.
struct Waiting {
    /// Its first stream position.
    first: u64,
    /// When it was admitted.
    at: Instant,
    /// It begins a unit (a file, or a pushed batch): its latency is recorded. A followed
    /// file's later batches wait only to carry their event times.
    unit: bool,
    /// The newest event time of its rows (µs since the Unix epoch), if the pipeline names
    /// an event-time column.
    newest_event: Option<i64>,
}

/// What was measured.
#[derive(Default)]
struct Measured {
    /// The latest admission-to-delivery times (seconds), oldest first.
    latencies: VecDeque<f64>,
    /// Admissions timed in all.
    timed: u64,
    /// Admissions not timed (the waiting queue was full).
    untimed: u64,
    /// The event-time lag at the latest delivery (seconds), if known.
    event_lag: Option<f64>,
}

/// The freshness of one stream.
pub(super) struct Freshness {
    /// The column holding each row's event time, if the pipeline names one.
    event_time: Option<String>,
    /// The highest stream position delivered (a batch's end), by any rank.
    delivered: AtomicU64,
    /// The first row of the oldest waiting admission (`u64::MAX`: none waits).
    next: AtomicU64,
    waiting: Mutex<VecDeque<Waiting>>,
    measured: Mutex<Measured>,
}

impl Freshness {
    /// Freshness of a stream whose rows' event times are in `event_time`, if named.
    pub fn new(event_time: Option<String>) -> Self {
        Freshness {
            event_time,
            delivered: AtomicU64::new(0),
            next: AtomicU64::new(u64::MAX),
            waiting: Mutex::default(),
            measured: Mutex::default(),
        }
    }

    /// The newest event time in `batch` (µs since the Unix epoch), when the pipeline
    /// names an event-time column: an error names what is wrong with the column.
    pub fn newest_event(&self, batch: &RecordBatch) -> Result<Option<i64>, String> {
        let Some(name) = &self.event_time else {
            return Ok(None);
        };
        newest_event(batch, name)
    }

    /// Records an admission of rows from stream position `first` on, admitted `at`
    /// (`unit`: it begins a file or is a pushed batch). Call it before its rows can be
    /// delivered.
    pub fn admitted(&self, first: u64, at: Instant, unit: bool, newest_event: Option<i64>) {
        if !unit && newest_event.is_none() {
            return;
        }
        let mut waiting = lock(&self.waiting);
        if waiting.len() >= WAITING {
            drop(waiting);
            if unit {
                lock(&self.measured).untimed += 1;
            }
            return;
        }
        if waiting.is_empty() {
            self.next.store(first, Ordering::SeqCst);
        }
        waiting.push_back(Waiting {
            first,
            at,
            unit,
            newest_event,
        });
    }

    /// A batch whose rows lie before stream position `end` was delivered.
    pub fn delivered(&self, end: u64) {
        self.delivered.fetch_max(end, Ordering::Relaxed);
        if end <= self.next.load(Ordering::SeqCst) {
            return;
        }
        let now = Instant::now();
        let (mut latencies, mut newest) = (Vec::new(), None);
        {
            let mut waiting = lock(&self.waiting);
            while waiting.front().is_some_and(|w| w.first < end) {
                let Some(w) = waiting.pop_front() else { break };
                if w.unit {
                    latencies.push(now.duration_since(w.at).as_secs_f64());
                }
                newest = w.newest_event.max(newest);
            }
            let next = waiting.front().map_or(u64::MAX, |w| w.first);
            self.next.store(next, Ordering::SeqCst);
        }
        for &s in &latencies {
            metrics::histogram!(crate::metrics::ADMISSION_TO_DELIVERY).record(s);
        }
        let lag = newest.map(|e| (unix_micros() - e) as f64 / 1e6);
        if let Some(lag) = lag {
            metrics::gauge!(crate::metrics::EVENT_TIME_LAG).set(lag);
        }
        let mut m = lock(&self.measured);
        m.timed += latencies.len() as u64;
        m.latencies.extend(latencies);
        let over = m.latencies.len().saturating_sub(KEPT);
        m.latencies.drain(..over);
        if lag.is_some() {
            m.event_lag = lag;
        }
    }

    /// What `status` reports: admission-to-delivery times (ms: the latest, and the median
    /// and 99th percentile of the last [`KEPT`]) and the event-time lag (seconds).
    pub fn status(&self) -> serde_json::Value {
        let m = lock(&self.measured);
        let mut sorted: Vec<f64> = m.latencies.iter().copied().collect();
        sorted.sort_by(f64::total_cmp);
        let ms = |s: Option<f64>| s.map(|s| (s * 1e6).round() / 1e3);
        let quantile = |q: f64| {
            let at = ((sorted.len() as f64 - 1.0) * q).round() as usize;
            ms(sorted.get(at).copied())
        };
        serde_json::json!({
            "admission_to_delivery_ms": {
                "timed": m.timed,
                "untimed": m.untimed,
                "last": ms(m.latencies.back().copied()),
                "p50": quantile(0.5),
                "p99": quantile(0.99),
            },
            "event_time_column": self.event_time,
            "event_time_lag_s": m.event_lag,
            "delivered_position": self.delivered.load(Ordering::Relaxed),
            "waiting_admissions": lock(&self.waiting).len(),
        })
    }
}

/// The newest value of timestamp column `name` of `batch`, in µs since the Unix epoch
/// (`None` when every value is null).
fn newest_event(batch: &RecordBatch, name: &str) -> Result<Option<i64>, String> {
    let column = batch
        .column_by_name(name)
        .ok_or_else(|| format!("the batch has no event-time column `{name}`"))?;
    if !matches!(column.data_type(), DataType::Timestamp(..)) {
        return Err(format!(
            "event-time column `{name}` is {}; a timestamp is needed",
            column.data_type()
        ));
    }
    let micros = cast(column, &DataType::Timestamp(TimeUnit::Microsecond, None))
        .map_err(|e| format!("event-time column `{name}`: {e}"))?;
    let micros = micros
        .as_any()
        .downcast_ref::<TimestampMicrosecondArray>()
        .ok_or_else(|| format!("event-time column `{name}` cannot be read as µs"))?;
    if micros.null_count() == micros.len() {
        return Ok(None);
    }
    Ok(max(micros))
}

fn unix_micros() -> i64 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(now.as_micros()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use arrow::array::TimestampMillisecondArray;
    use arrow::datatypes::{Field, Schema};

    use super::*;

    #[test]
    fn an_admission_is_timed_at_the_first_delivery_past_its_first_row() {
        let f = Freshness::new(None);
        let t0 = Instant::now() - Duration::from_millis(50);
        f.admitted(0, t0, true, None);
        f.admitted(100, t0, true, None);
        // Rows 0..40 delivered: the first admission only.
        f.delivered(40);
        let s = f.status();
        assert_eq!(s["admission_to_delivery_ms"]["timed"], 1, "{s}");
        assert!(s["admission_to_delivery_ms"]["last"].as_f64().unwrap() >= 50.0);
        assert_eq!(s["waiting_admissions"], 1);
        // Up to row 100 is not past the second's first row; 101 is.
        f.delivered(100);
        assert_eq!(f.status()["waiting_admissions"], 1);
        f.delivered(101);
        let s = f.status();
        assert_eq!(s["admission_to_delivery_ms"]["timed"], 2, "{s}");
        assert_eq!(s["waiting_admissions"], 0);
        assert!(s["event_time_lag_s"].is_null());
    }

    #[test]
    fn the_waiting_queue_is_bounded() {
        let f = Freshness::new(None);
        for k in 0..WAITING as u64 + 10 {
            f.admitted(k, Instant::now(), true, None);
        }
        f.delivered(u64::MAX);
        let s = f.status();
        assert_eq!(s["admission_to_delivery_ms"]["timed"], WAITING as u64);
        assert_eq!(s["admission_to_delivery_ms"]["untimed"], 10);
    }

    fn stamped(millis: Vec<Option<i64>>) -> RecordBatch {
        let ts = TimestampMillisecondArray::from(millis).with_timezone("UTC");
        let schema = Schema::new(vec![Field::new("ts", ts.data_type().clone(), true)]);
        RecordBatch::try_new(Arc::new(schema), vec![Arc::new(ts)]).unwrap()
    }

    #[test]
    fn event_time_lag_is_the_newest_delivered_event_age() {
        let f = Freshness::new(Some("ts".into()));
        let now_ms = unix_micros() / 1000;
        let batch = stamped(vec![Some(now_ms - 90_000), None, Some(now_ms - 30_000)]);
        let newest = f.newest_event(&batch).unwrap();
        assert_eq!(newest, Some((now_ms - 30_000) * 1000));
        f.admitted(0, Instant::now(), true, newest);
        f.delivered(3);
        let lag = f.status()["event_time_lag_s"].as_f64().unwrap();
        assert!((30.0..40.0).contains(&lag), "{lag}");
        assert_eq!(f.newest_event(&stamped(vec![None])).unwrap(), None);
    }

    #[test]
    fn a_missing_or_mistyped_event_time_column_is_named() {
        let f = Freshness::new(Some("when".into()));
        let err = f.newest_event(&stamped(vec![Some(1)])).unwrap_err();
        assert!(err.contains("no event-time column `when`"), "{err}");
        let ints = RecordBatch::try_from_iter([(
            "when",
            Arc::new(arrow::array::Int64Array::from(vec![1])) as _,
        )])
        .unwrap();
        let err = f.newest_event(&ints).unwrap_err();
        assert!(err.contains("Int64; a timestamp is needed"), "{err}");
    }
}
