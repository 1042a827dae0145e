//! Plain, one-value-at-a-time definitions of every transform, written for clarity and
//! used only by tests to check the kernels.

use crate::kernels::numeric::NumOp;

/// The chain applied to one value; `None` when it is missing at the end.
pub fn chain(x: f64, valid: bool, ops: &[NumOp]) -> Option<f64> {
    let mut v = if valid { Some(x) } else { None };
    for op in ops {
        v = match (*op, v) {
            (NumOp::FillNull(fill), None) => Some(fill),
            (_, None) => None,
            (NumOp::FillNull(_), Some(x)) => Some(x),
            (NumOp::Log1p, Some(x)) => Some(x.ln_1p()),
            (NumOp::Affine { sub, mul }, Some(x)) => Some((x - sub) * mul),
            (NumOp::Clip { lo, hi }, Some(x)) => Some(if x.is_nan() { x } else { x.clamp(lo, hi) }),
        };
    }
    v
}

/// The bucket of a value: how many boundaries are `<= x`; missing or NaN is the extra bucket.
pub fn bucket(x: Option<f64>, boundaries: &[f64]) -> i64 {
    match x {
        Some(x) if !x.is_nan() => boundaries.iter().filter(|&&b| b <= x).count() as i64,
        _ => boundaries.len() as i64 + 1,
    }
}

/// A vocabulary by the definition: most frequent first, ties by ascending bytes; values
/// seen fewer than `min_count` times dropped; at most `max_size` kept.
pub fn vocab(values: &[Option<&str>], max_size: Option<usize>, min_count: u64) -> Vec<String> {
    let mut counts = std::collections::BTreeMap::<&str, u64>::new();
    for v in values.iter().flatten() {
        *counts.entry(v).or_default() += 1;
    }
    let mut entries: Vec<(&str, u64)> = counts
        .into_iter()
        .filter(|(_, c)| *c >= min_count)
        .collect();
    entries.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.as_bytes().cmp(b.0.as_bytes())));
    entries.truncate(max_size.unwrap_or(usize::MAX));
    entries.into_iter().map(|(v, _)| v.to_string()).collect()
}

/// The vocabulary index of a value: its position, or the vocabulary size when unseen or null.
pub fn vocab_index(v: Option<&str>, vocab: &[String]) -> i64 {
    v.and_then(|v| vocab.iter().position(|w| w == v))
        .unwrap_or(vocab.len()) as i64
}

/// `xxhash64(bytes, 0) mod n`, null to `n`.
pub fn hash_bucket(v: Option<&str>, n: u64) -> i64 {
    v.map_or(n, |v| xxhash_rust::xxh64::xxh64(v.as_bytes(), 0) % n) as i64
}

/// Population mean and std of the finite values.
pub fn mean_std(values: &[f64]) -> (f64, f64) {
    let finite: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    let n = finite.len() as f64;
    let mean = finite.iter().sum::<f64>() / n;
    let var = finite.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
    (mean, var.sqrt())
}
