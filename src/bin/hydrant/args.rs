//! Value parsers for the command line: every count and size has a range, and floats are
//! finite, so that a bad argument is one line at parse time, never a panic (an overflowing
//! allocation, a channel capacity, `Duration::from_secs_f64(NaN)`) later in a worker.

use std::fmt::Display;
use std::str::FromStr;

/// Parses an integer in `lo..=hi`.
pub(crate) fn int_in<T>(lo: T, hi: T) -> impl Fn(&str) -> Result<T, String> + Clone
where
    T: FromStr + PartialOrd + Display + Copy,
    T::Err: Display,
{
    move |text| {
        let v: T = text.trim().parse().map_err(|e| format!("{e}"))?;
        if v < lo || v > hi {
            return Err(format!("must be {lo} to {hi}"));
        }
        Ok(v)
    }
}

/// Parses a finite float in `lo..=hi`.
pub(crate) fn float_in(lo: f64, hi: f64) -> impl Fn(&str) -> Result<f64, String> + Clone {
    move |text| {
        let v: f64 = text.trim().parse().map_err(|e| format!("{e}"))?;
        if !v.is_finite() || v < lo || v > hi {
            return Err(format!("must be a number from {lo} to {hi}"));
        }
        Ok(v)
    }
}

/// The most worker threads per process (idle ones are not started, see
/// `hydrant::useful_workers`).
pub(crate) const MAX_WORKERS: usize = 1024;
/// The most processes in a cluster.
pub(crate) const MAX_PROCESSES: usize = 4096;
/// The most data-parallel ranks.
pub(crate) const MAX_RANKS: usize = 1 << 20;
/// The most of them one process owns (a world of [`MAX_RANKS`] takes 8 processes).
pub(crate) const MAX_LOCAL_RANKS: usize = 1 << 17;
/// The most rows per rank per step.
pub(crate) const MAX_BATCH_SIZE: usize = 1 << 26;
/// The most batches a loader keeps ready.
pub(crate) const MAX_PREFETCH: usize = 1024;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_and_floats() {
        let p = int_in(1usize, 10);
        assert_eq!(p("3"), Ok(3));
        assert!(p("0").unwrap_err().contains("1 to 10"));
        assert!(p("18446744073709551616").is_err());
        assert!(p("-1").is_err());
        let f = float_in(0.0, 1e3);
        assert_eq!(f("2.5"), Ok(2.5));
        for bad in ["NaN", "inf", "-inf", "-1", "1e9", "x"] {
            assert!(f(bad).is_err(), "{bad}");
        }
    }
}
