//! Mergeable statistics: what fitting accumulates per column, so that workers can fit
//! their share of the input and merge the results in any grouping.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use tdigest::TDigest;

use crate::state::FittedParam;

/// Count, mean and sum of squared deviations, merged with Chan et al.'s formula.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Moments {
    /// Values seen.
    pub count: u64,
    /// Their mean.
    pub mean: f64,
    /// Sum of squared deviations from the mean.
    pub m2: f64,
}

/// Sums `f(v)` over `values` in eight independent lanes: a plain `sum` is one chain of
/// dependent additions (the compiler may not reorder float adds), eight lanes vectorize.
#[inline(always)]
fn lane_sum(values: &[f64], f: impl Fn(f64) -> f64) -> f64 {
    let mut lanes = [0f64; 8];
    let mut chunks = values.chunks_exact(8);
    for chunk in &mut chunks {
        for (l, &v) in lanes.iter_mut().zip(chunk) {
            *l += f(v);
        }
    }
    let tail: f64 = chunks.remainder().iter().map(|&v| f(v)).sum();
    lanes.iter().sum::<f64>() + tail
}

impl Moments {
    /// Adds a slice of values (two passes over it: it is a cache-resident chunk).
    #[inline]
    pub fn add(&mut self, values: &[f64]) {
        if values.is_empty() {
            return;
        }
        let n = values.len() as f64;
        let mean = lane_sum(values, |v| v) / n;
        let m2 = lane_sum(values, |v| (v - mean) * (v - mean));
        self.merge(&Moments {
            count: values.len() as u64,
            mean,
            m2,
        });
    }

    /// Folds another set of moments into this one.
    pub fn merge(&mut self, other: &Moments) {
        if other.count == 0 {
            return;
        }
        if self.count == 0 {
            *self = other.clone();
            return;
        }
        let (na, nb) = (self.count as f64, other.count as f64);
        let n = na + nb;
        let delta = other.mean - self.mean;
        self.mean += delta * nb / n;
        self.m2 += other.m2 + delta * delta * na * nb / n;
        self.count += other.count;
    }

    /// Population standard deviation (0 when nothing was seen).
    pub fn std(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            (self.m2 / self.count as f64).sqrt()
        }
    }
}

/// Values held back before they are folded into the digest, to fold them in bulk.
const PENDING: usize = 1 << 16;

/// One statistic being accumulated for one fitted step.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Partial {
    /// For standardize.
    Moments(Moments),
    /// For min_max: (min, max) of what was seen, if anything.
    MinMax(Option<(f64, f64)>),
    /// For quantile_bucketize: a t-digest plus values not yet folded into it.
    Quantiles {
        /// Buckets wanted.
        n: usize,
        /// The digest so far.
        digest: TDigest,
        /// Values seen since the last fold.
        pending: Vec<f64>,
    },
    /// For vocab: occurrences of each value.
    Counts {
        /// At most this many values kept.
        max_size: Option<usize>,
        /// Values seen fewer times are dropped.
        min_count: u64,
        /// Occurrences so far.
        counts: HashMap<String, u64, foldhash::fast::FixedState>,
    },
}

impl Partial {
    /// Adds finite, present numeric values.
    #[inline]
    pub fn add_numbers(&mut self, values: &[f64]) {
        match self {
            Partial::Moments(m) => m.add(values),
            Partial::MinMax(mm) => {
                for &v in values {
                    *mm = Some(mm.map_or((v, v), |(lo, hi)| (lo.min(v), hi.max(v))));
                }
            }
            Partial::Quantiles {
                digest, pending, ..
            } => {
                pending.extend_from_slice(values);
                if pending.len() >= PENDING {
                    *digest = digest.merge_unsorted(std::mem::take(pending));
                }
            }
            Partial::Counts { .. } => {}
        }
    }

    /// Adds `count` occurrences of a string value.
    pub fn add_string(&mut self, value: &str, count: u64) {
        if let Partial::Counts { counts, .. } = self {
            match counts.get_mut(value) {
                Some(c) => *c += count,
                None => {
                    counts.insert(value.to_string(), count);
                }
            }
        }
    }

    /// Folds another partial of the same statistic into this one.
    pub fn merge(&mut self, other: Partial) {
        match (self, other) {
            (Partial::Moments(a), Partial::Moments(b)) => a.merge(&b),
            (Partial::MinMax(a), Partial::MinMax(b)) => {
                if let Some((lo, hi)) = b {
                    *a = Some(a.map_or((lo, hi), |(x, y)| (x.min(lo), y.max(hi))));
                }
            }
            (
                Partial::Quantiles {
                    digest, pending, ..
                },
                Partial::Quantiles {
                    digest: d2,
                    pending: p2,
                    ..
                },
            ) => {
                let mut all = std::mem::take(pending);
                all.extend(p2);
                let folded = digest.merge_unsorted(all);
                *digest = TDigest::merge_digests(vec![folded, d2]);
            }
            (Partial::Counts { counts, .. }, Partial::Counts { counts: c2, .. }) => {
                for (k, v) in c2 {
                    *counts.entry(k).or_default() += v;
                }
            }
            (a, b) => panic!("merging different statistics: {a:?} and {b:?}"),
        }
    }

    /// The fitted parameters this statistic yields.
    pub fn finish(self) -> FittedParam {
        match self {
            Partial::Moments(m) => FittedParam::Standardize {
                mean: m.mean,
                std: m.std(),
            },
            Partial::MinMax(mm) => {
                let (min, max) = mm.unwrap_or((0.0, 0.0));
                FittedParam::MinMax { min, max }
            }
            Partial::Quantiles { n, digest, pending } => {
                let digest = digest.merge_unsorted(pending);
                let mut boundaries: Vec<f64> = Vec::new();
                if !digest.is_empty() {
                    for i in 1..n {
                        let b = digest.estimate_quantile(i as f64 / n as f64);
                        if b.is_finite() && boundaries.last().is_none_or(|&last| b > last) {
                            boundaries.push(b);
                        }
                    }
                }
                FittedParam::Quantiles { boundaries }
            }
            Partial::Counts {
                max_size,
                min_count,
                counts,
            } => {
                let mut entries: Vec<(String, u64)> = counts
                    .into_iter()
                    .filter(|(_, c)| *c >= min_count)
                    .collect();
                // Most frequent first; ties by the value's bytes, ascending.
                entries.sort_unstable_by(|a, b| {
                    b.1.cmp(&a.1)
                        .then_with(|| a.0.as_bytes().cmp(b.0.as_bytes()))
                });
                entries.truncate(max_size.unwrap_or(usize::MAX));
                FittedParam::Vocab {
                    values: entries.into_iter().map(|(v, _)| v).collect(),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference;

    #[test]
    fn moments_merge_in_any_grouping() {
        let values: Vec<f64> = (0..1000)
            .map(|i| ((i * 7919) % 1000) as f64 / 10.0 - 20.0)
            .collect();
        let (mean, std) = reference::mean_std(&values);
        for split in [0, 1, 333, 999, 1000] {
            let mut a = Moments::default();
            a.add(&values[..split]);
            let mut b = Moments::default();
            for chunk in values[split..].chunks(17) {
                b.add(chunk);
            }
            a.merge(&b);
            assert_eq!(a.count, 1000);
            assert!(
                (a.mean - mean).abs() < 1e-12 && (a.std() - std).abs() < 1e-12,
                "split {split}"
            );
        }
        assert_eq!(Moments::default().std(), 0.0);
    }

    #[test]
    fn vocab_orders_by_count_then_bytes_and_applies_limits() {
        let data = ["b", "a", "c", "b", "a", "d", "b", "e", "e"];
        let refs: Vec<Option<&str>> = data.iter().map(|s| Some(*s)).collect();
        for (max_size, min_count) in [
            (None, 1),
            (Some(2), 1),
            (None, 2),
            (Some(1), 3),
            (Some(10), 4),
        ] {
            let mut p = Partial::Counts {
                max_size,
                min_count,
                counts: HashMap::default(),
            };
            let mut q = p.clone();
            for (i, s) in data.iter().enumerate() {
                if i % 2 == 0 {
                    p.add_string(s, 1)
                } else {
                    q.add_string(s, 1)
                }
            }
            p.merge(q);
            let FittedParam::Vocab { values } = p.finish() else {
                panic!()
            };
            assert_eq!(
                values.iter().collect::<Vec<_>>(),
                reference::vocab(&refs, max_size, min_count),
                "{max_size:?} {min_count}"
            );
        }
    }

    #[test]
    fn quantiles_are_close_and_ascending() {
        let mut a = Partial::Quantiles {
            n: 4,
            digest: TDigest::new_with_size(100),
            pending: vec![],
        };
        let mut b = a.clone();
        let values: Vec<f64> = (0..100_000).map(|i| i as f64).collect();
        a.add_numbers(&values[..70_000]);
        b.add_numbers(&values[70_000..]);
        a.merge(b);
        let FittedParam::Quantiles { boundaries } = a.finish() else {
            panic!()
        };
        assert_eq!(boundaries.len(), 3);
        for (b, want) in boundaries.iter().zip([25_000.0, 50_000.0, 75_000.0]) {
            assert!((b - want).abs() < 500.0, "{b} vs {want}");
        }
    }

    #[test]
    fn min_max_ignores_empty_sides() {
        let mut a = Partial::MinMax(None);
        a.add_numbers(&[3.0, -1.0]);
        a.merge(Partial::MinMax(None));
        let mut b = Partial::MinMax(None);
        b.merge(a);
        assert!(
            matches!(b.finish(), FittedParam::MinMax { min, max } if min == -1.0 && max == 3.0)
        );
    }
}
