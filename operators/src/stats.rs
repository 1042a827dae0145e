//! Mergeable statistics: what fitting accumulates per column, so that workers can fit
//! their share of the input and merge the results in any grouping.

use serde::{Deserialize, Serialize};
use tdigest::TDigest;

use crate::kernels::categorical::VocabIndex;
use crate::state::FittedParam;
use crate::vocabulary::Vocabulary;

/// Count, mean and sum of squared deviations, merged with Chan et al.'s formula.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Moments {
    /// Values seen.
    pub count: u64,
    /// Their mean.
    pub mean: f64,
    /// Sum of squared deviations from the mean.
    pub m2: f64,
    /// The one value seen, while every value seen is the same: a constant column then
    /// fits its exact mean and a std of exactly 0, where the sums leave rounding noise
    /// (0.1 ten thousand times gave std 2.3e-16, which standardized 0.1 to 1.01).
    #[serde(default)]
    pub same: Option<f64>,
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
        // Stops at the first value that differs: one compare for most chunks.
        let first = values[0];
        let same = values.iter().all(|&v| v == first).then_some(first);
        self.merge(&Moments {
            count: values.len() as u64,
            mean,
            m2,
            same,
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
        self.same = self.same.filter(|&v| other.same == Some(v));
    }

    /// The mean: exactly the value seen, where only one value was.
    pub fn mean(&self) -> f64 {
        self.same.unwrap_or(self.mean)
    }

    /// Population standard deviation (0 when nothing was seen, or only one value).
    pub fn std(&self) -> f64 {
        if self.count == 0 || self.same.is_some() {
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
        counts: Tally,
    },
}

/// Occurrences of string values, mergeable.
///
/// Values are interned in one buffer (a [`VocabIndex`]) and counted by index: a value seen
/// for the first time is one append to the buffer, not an allocation, and a tally is two
/// buffers and a table of indices to copy or send. With a `HashMap<String, u64>`, about
/// a third of a vocabulary fit's samples went to allocating, comparing and freeing keys.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(try_from = "TallyData", into = "TallyData")]
pub struct Tally {
    index: VocabIndex,
    counts: Vec<u64>,
}

/// A tally as it is sent: values in index order and their counts.
#[derive(Serialize, Deserialize)]
struct TallyData {
    values: Vocabulary,
    counts: Vec<u64>,
}

impl Tally {
    /// Adds `count` occurrences of `value`.
    #[inline]
    pub fn add(&mut self, value: &str, count: u64) {
        let i = self.index.intern(value);
        match self.counts.get_mut(i) {
            Some(c) => *c += count,
            None => self.counts.push(count),
        }
    }

    /// Adds each `(value, count)`: [`Tally::add`] for each, their lookups batched.
    pub fn add_all<'a>(&mut self, values: impl IntoIterator<Item = (&'a str, u64)>) {
        let counts = &mut self.counts;
        self.index
            .intern_all(values, |i, count| match counts.get_mut(i) {
                Some(c) => *c += count,
                None => counts.push(count),
            });
    }

    /// Folds another tally into this one.
    pub fn merge(&mut self, other: Tally) {
        if self.is_empty() {
            *self = other;
            return;
        }
        self.add_all(other.iter());
    }

    /// The distinct values seen.
    pub fn len(&self) -> usize {
        self.counts.len()
    }

    /// Whether no value was seen.
    pub fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }

    /// The values with their counts, in the order they were first seen.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&str, u64)> + '_ {
        self.index.values().iter().zip(self.counts.iter().copied())
    }

    /// The values seen at least `min_count` times, most frequent first, ties by the
    /// value's bytes ascending, at most `max_size` of them.
    pub fn most_frequent(&self, max_size: Option<usize>, min_count: u64) -> Vocabulary {
        let values = self.index.values();
        let bytes = |i: u32| values.get(i as usize).unwrap_or_default().as_bytes();
        // Sorted by a key that settles most comparisons without reaching into the buffer:
        // the count, then the value's first 16 bytes (zero-padded, big-endian: where two
        // prefixes differ, the values differ the same way), then the whole value.
        let mut order: Vec<(u64, u128, u32)> = self
            .counts
            .iter()
            .enumerate()
            .filter(|&(_, &c)| c >= min_count)
            .map(|(i, &c)| (c, prefix(bytes(i as u32)), i as u32))
            .collect();
        let cmp = |a: &(u64, u128, u32), b: &(u64, u128, u32)| {
            (b.0.cmp(&a.0))
                .then(a.1.cmp(&b.1))
                .then_with(|| bytes(a.2).cmp(bytes(b.2)))
        };
        let keep = max_size.unwrap_or(usize::MAX);
        if keep < order.len() {
            order.select_nth_unstable_by(keep, cmp);
            order.truncate(keep);
        }
        order.sort_unstable_by(cmp);
        order
            .into_iter()
            .map(|(_, _, i)| values.get(i as usize).unwrap_or_default())
            .collect()
    }
}

impl Tally {
    /// `prev` grown by the values it lacks, most frequent first (as
    /// [`Tally::most_frequent`] orders them), while it has fewer than `max_size`: a value of
    /// `prev` keeps its index whatever its count, so ids stay stable across versions.
    pub fn grow(&self, prev: &Vocabulary, max_size: Option<usize>, min_count: u64) -> Vocabulary {
        let max = max_size.unwrap_or(usize::MAX);
        if prev.len() >= max {
            return prev.clone();
        }
        let mut grown = VocabIndex::new(prev);
        for value in self.most_frequent(None, min_count).iter() {
            if grown.len() >= max {
                break;
            }
            grown.intern(value);
        }
        grown.values().clone()
    }

    /// Each count multiplied by `factor` (rounded to the nearest); values whose count
    /// rounds to 0 are dropped, so a decayed tally forgets values no longer seen.
    pub fn decayed(&self, factor: f64) -> Tally {
        let mut kept = Tally::default();
        for (value, count) in self.iter() {
            let c = (count as f64 * factor).round() as u64;
            if c > 0 {
                kept.add(value, c);
            }
        }
        kept
    }
}

/// The first 16 bytes of `bytes`, zero-padded, as a big-endian number.
#[inline]
fn prefix(bytes: &[u8]) -> u128 {
    let mut p = [0u8; 16];
    let n = bytes.len().min(16);
    p[..n].copy_from_slice(&bytes[..n]);
    u128::from_be_bytes(p)
}

impl TryFrom<TallyData> for Tally {
    type Error = String;
    fn try_from(data: TallyData) -> Result<Self, String> {
        if data.values.len() != data.counts.len() {
            return Err(format!(
                "a tally of {} values has {} counts",
                data.values.len(),
                data.counts.len()
            ));
        }
        let mut tally = Tally::default();
        for (value, count) in data.values.iter().zip(data.counts) {
            tally.add(value, count);
        }
        Ok(tally)
    }
}

impl From<Tally> for TallyData {
    fn from(tally: Tally) -> Self {
        TallyData {
            values: tally.index.values().clone(),
            counts: tally.counts,
        }
    }
}

impl Partial {
    /// Whether merging partials in another grouping gives another result, and the partial
    /// is small enough to keep one per unit of input: floating-point moments. (Extremes
    /// and counts are exact in any grouping; a quantile digest is an approximation whose
    /// size is bounded only as one, so it is kept whole.)
    pub fn depends_on_grouping(&self) -> bool {
        matches!(self, Partial::Moments(_))
    }

    /// The same statistic with nothing seen.
    pub fn emptied(&self) -> Partial {
        match self {
            Partial::Moments(_) => Partial::Moments(Moments::default()),
            Partial::MinMax(_) => Partial::MinMax(None),
            Partial::Quantiles { n, digest, .. } => Partial::Quantiles {
                n: *n,
                digest: TDigest::new_with_size(digest.max_size()),
                pending: Vec::new(),
            },
            Partial::Counts {
                max_size,
                min_count,
                ..
            } => Partial::Counts {
                max_size: *max_size,
                min_count: *min_count,
                counts: Tally::default(),
            },
        }
    }

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
            counts.add(value, count);
        }
    }

    /// [`Partial::add_string`] for each `(value, count)`, their lookups batched.
    pub fn add_strings<'a>(&mut self, values: impl IntoIterator<Item = (&'a str, u64)>) {
        if let Partial::Counts { counts, .. } = self {
            counts.add_all(values);
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
                // Values not folded yet stay unfolded until there are enough of them: a
                // digest made from all of them at once does not depend on how they were
                // grouped, so a small fit gives the same quantiles on any layout.
                pending.extend(p2);
                if !d2.is_empty() {
                    *digest = match digest.is_empty() {
                        true => d2,
                        false => TDigest::merge_digests(vec![digest.clone(), d2]),
                    };
                }
                if pending.len() >= PENDING {
                    *digest = digest.merge_unsorted(std::mem::take(pending));
                }
            }
            (Partial::Counts { counts, .. }, Partial::Counts { counts: c2, .. }) => {
                counts.merge(c2)
            }
            (a, b) => panic!("merging different statistics: {a:?} and {b:?}"),
        }
    }

    /// Weighs what was seen by `factor` (a decay: `0.5` halves it). Moments and counts
    /// decay; extremes and quantile digests summarize everything seen.
    pub fn decay(&mut self, factor: f64) {
        match self {
            Partial::Moments(m) => {
                let count = (m.count as f64 * factor).round() as u64;
                if count == 0 {
                    *m = Moments::default();
                } else {
                    m.m2 *= count as f64 / m.count as f64;
                    m.count = count;
                }
            }
            Partial::Counts { counts, .. } => *counts = counts.decayed(factor),
            Partial::MinMax(_) | Partial::Quantiles { .. } => {}
        }
    }

    /// The parameters this statistic yields as the next version of `prev` (`None`: the
    /// first): a vocabulary grows from `prev`'s (each of its values keeps its index, see
    /// `Tally::grow`) and its unknown index stays at its `max_size`; other parameters are
    /// fitted anew.
    pub fn finish_after(self, prev: Option<&FittedParam>) -> FittedParam {
        match (self, prev) {
            (
                Partial::Counts {
                    max_size,
                    min_count,
                    counts,
                },
                prev,
            ) => {
                let empty = Vocabulary::new();
                let prev = prev
                    .and_then(FittedParam::vocabulary)
                    .map_or(&empty, |(v, _)| v);
                let values = counts.grow(prev, max_size, min_count);
                match max_size {
                    Some(max) => FittedParam::BoundedVocab {
                        values,
                        unknown: max as u64,
                    },
                    None => FittedParam::Vocab { values },
                }
            }
            (partial, _) => partial.finish(),
        }
    }

    /// The fitted parameters this statistic yields.
    pub fn finish(self) -> FittedParam {
        match self {
            Partial::Moments(m) => FittedParam::Standardize {
                mean: m.mean(),
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
            } => FittedParam::Vocab {
                values: counts.most_frequent(max_size, min_count),
            },
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

    /// A constant column fits exactly its value and a std of 0, in any grouping, where
    /// the sums alone left rounding noise (std 2.3e-16 for 0.1, which standardized it to
    /// 1.01 and any other data by 4e15); a column with one other value does not.
    #[test]
    fn a_constant_column_fits_its_value_and_no_spread() {
        for v in [0.1, 0.3, 1000.1, -7.25] {
            let values = vec![v; 10_000];
            let mut noisy = Moments::default();
            noisy.add(&values[..3_333]);
            let mut rest = Moments::default();
            for chunk in values[3_333..].chunks(1_000) {
                rest.add(chunk);
            }
            noisy.merge(&rest);
            let fitted = Partial::Moments(noisy).finish();
            assert_eq!(
                fitted,
                FittedParam::Standardize { mean: v, std: 0.0 },
                "{v}"
            );
        }
        let mut two = Moments::default();
        two.add(&[0.1; 100]);
        two.add(&[0.2]);
        assert!(two.same.is_none() && two.std() > 0.0);
        let mut nan = Moments::default();
        nan.add(&[f64::NAN, f64::NAN]);
        assert!(nan.same.is_none());
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
                counts: Tally::default(),
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
    fn a_tally_merges_and_travels_as_values_and_counts() {
        let mut a = Tally::default();
        for v in ["x", "y", "x", "", "é"] {
            a.add(v, 1);
        }
        let mut b = Tally::default();
        b.add("y", 5);
        b.add("z", 2);
        let mut merged = b.clone();
        merged.merge(a.clone());
        let pairs: Vec<_> = merged.iter().collect();
        assert_eq!(pairs, [("y", 6), ("z", 2), ("x", 2), ("", 1), ("é", 1)]);
        let mut empty = Tally::default();
        empty.merge(a.clone());
        assert_eq!(
            empty.iter().collect::<Vec<_>>(),
            a.iter().collect::<Vec<_>>()
        );

        let json = serde_json::to_string(&merged).unwrap();
        assert_eq!(
            json,
            r#"{"values":["y","z","x","","é"],"counts":[6,2,2,1,1]}"#
        );
        let back: Tally = serde_json::from_str(&json).unwrap();
        assert_eq!(back.iter().collect::<Vec<_>>(), pairs);
        // A repeated value from a peer is merged, not indexed twice.
        let back: Tally = serde_json::from_str(r#"{"values":["a","a"],"counts":[1,2]}"#).unwrap();
        assert_eq!(back.iter().collect::<Vec<_>>(), [("a", 3)]);
        let err = serde_json::from_str::<Tally>(r#"{"values":["a"],"counts":[]}"#).unwrap_err();
        assert!(
            err.to_string().contains("a tally of 1 values has 0 counts"),
            "{err}"
        );

        let top: Vec<String> = merged
            .most_frequent(Some(3), 2)
            .iter()
            .map(String::from)
            .collect();
        assert_eq!(top, ["y", "x", "z"]);
    }

    proptest::proptest! {
        /// The most frequent values match the reference, for values that share long
        /// prefixes, end in NUL bytes or are prefixes of each other.
        #[test]
        fn most_frequent_matches_the_reference(
            picks in proptest::collection::vec(0usize..12, 0..200),
            max_size in proptest::option::of(0usize..14),
            min_count in 0u64..4,
        ) {
            const VALUES: [&str; 12] = [
                "", "a", "a\0", "a\0\0", "b", "0123456789abcdef", "0123456789abcdefX",
                "0123456789abcdefY", "0123456789abcdeX", "é", "0123456789abcdef\0", "\u{7f}",
            ];
            let data: Vec<Option<&str>> = picks.iter().map(|&i| Some(VALUES[i])).collect();
            let mut tally = Tally::default();
            for v in data.iter().flatten() {
                tally.add(v, 1);
            }
            let got: Vec<String> =
                tally.most_frequent(max_size, min_count).iter().map(String::from).collect();
            proptest::prop_assert_eq!(got, reference::vocab(&data, max_size, min_count));
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

    fn tally(pairs: &[(&str, u64)]) -> Tally {
        let mut t = Tally::default();
        pairs.iter().for_each(|&(v, c)| t.add(v, c));
        t
    }

    #[test]
    fn a_grown_vocabulary_keeps_every_index_and_adds_by_count_up_to_its_size() {
        let prev: Vocabulary = ["b", "a"].into_iter().collect();
        // `a` and `b` are rare now: they keep their ids all the same.
        let t = tally(&[("a", 1), ("c", 5), ("d", 9), ("e", 2), ("f", 1)]);
        let grown = t.grow(&prev, Some(4), 2);
        assert_eq!(grown.iter().collect::<Vec<_>>(), ["b", "a", "d", "c"]);
        let unbounded = t.grow(&prev, None, 2);
        assert_eq!(
            unbounded.iter().collect::<Vec<_>>(),
            ["b", "a", "d", "c", "e"]
        );
        // Full already: unchanged. From nothing: what a one-shot fit gives.
        assert_eq!(t.grow(&grown, Some(4), 1), grown);
        assert_eq!(
            t.grow(&Vocabulary::new(), Some(3), 1),
            t.most_frequent(Some(3), 1)
        );
    }

    #[test]
    fn decay_weighs_counts_and_moments_and_keeps_extremes() {
        let t = tally(&[("a", 10), ("b", 1), ("c", 3)]).decayed(0.5);
        assert_eq!(t.iter().collect::<Vec<_>>(), [("a", 5), ("b", 1), ("c", 2)]);
        assert_eq!(tally(&[("a", 10), ("b", 1)]).decayed(0.1).len(), 1);
        let mut m = Partial::Moments(Moments::default());
        m.add_numbers(&[1.0, 2.0, 3.0, 4.0]);
        m.decay(0.5);
        let Partial::Moments(d) = &m else { panic!() };
        assert_eq!((d.count, d.mean), (2, 2.5));
        // The spread is unchanged: only the weight halves.
        assert!((d.std() - 1.25f64.sqrt()).abs() < 1e-12);
        m.decay(0.1);
        assert!(matches!(&m, Partial::Moments(d) if *d == Moments::default()));
        let mut mm = Partial::MinMax(Some((-1.0, 3.0)));
        mm.decay(0.0);
        assert!(matches!(mm, Partial::MinMax(Some((lo, hi))) if lo == -1.0 && hi == 3.0));
    }
}
