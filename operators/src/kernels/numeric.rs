//! The fused numeric chain: fill_null, log1p, affine (standardize, min_max) and clip in one
//! pass over a float64 column, ending as float32 values or bucket indices.
//!
//! "One pass" is literal at the memory level: the column is walked in chunks small enough
//! to stay in L1, each step runs as a tight (vectorized) loop over the chunk, and only the
//! final values are written out. Kernels apply every step to every slot, nulls included,
//! and use the validity only where a step needs it (fill_null) and at the end.

use arrow::buffer::NullBuffer;

use super::log1p::log1p;

/// Values processed per chunk: 8 KiB of f64, well inside L1.
const CHUNK: usize = 1024;

/// One compiled numeric step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum NumOp {
    /// Replace missing values by a constant; later steps see no missing values.
    FillNull(f64),
    /// `ln(1 + x)`.
    Log1p,
    /// `(x - sub) * mul`: standardize and min_max once fitted.
    Affine {
        /// Subtracted first (the mean, or the minimum).
        sub: f64,
        /// Then multiplied by (the reciprocal of the std, or of the range).
        mul: f64,
    },
    /// Clamp into `[lo, hi]`; NaN stays NaN.
    Clip {
        /// Lower bound.
        lo: f64,
        /// Upper bound.
        hi: f64,
    },
}

impl NumOp {
    /// An affine step that divides by `div`, treating a zero (or non-finite) divisor as 1.
    pub fn divide(sub: f64, div: f64) -> NumOp {
        let div = if div == 0.0 || !div.is_finite() {
            1.0
        } else {
            div
        };
        NumOp::Affine {
            sub,
            mul: 1.0 / div,
        }
    }
}

/// Runs `ops` over `values` chunk by chunk and hands each finished chunk to `sink` with its
/// start offset and, where some values are still missing (null and never filled), a mask of
/// them.
#[inline(always)]
fn for_each_chunk(
    values: &[f64],
    nulls: Option<&NullBuffer>,
    ops: &[NumOp],
    mut sink: impl FnMut(usize, &[f64], Option<&[bool]>),
) {
    let mut buf = [0f64; CHUNK];
    let mut missing = [false; CHUNK];
    for (c, chunk) in values.chunks(CHUNK).enumerate() {
        let start = c * CHUNK;
        let len = chunk.len();
        let buf = &mut buf[..len];
        let missing = &mut missing[..len];
        buf.copy_from_slice(chunk);
        let mut has_missing = match nulls {
            Some(n) if n.null_count() > 0 => {
                expand_missing(n, start, missing);
                true
            }
            _ => false,
        };
        for op in ops {
            match *op {
                NumOp::FillNull(v) => {
                    if has_missing {
                        for (x, &m) in buf.iter_mut().zip(missing.iter()) {
                            *x = if m { v } else { *x };
                        }
                        has_missing = false;
                    }
                }
                NumOp::Log1p => buf.iter_mut().for_each(|x| *x = log1p(*x)),
                NumOp::Affine { sub, mul } => buf.iter_mut().for_each(|x| *x = (*x - sub) * mul),
                NumOp::Clip { lo, hi } => buf.iter_mut().for_each(|x| {
                    let v = *x;
                    *x = if v < lo {
                        lo
                    } else if v > hi {
                        hi
                    } else {
                        v
                    }
                }),
            }
        }
        sink(start, buf, if has_missing { Some(missing) } else { None });
    }
}

/// Writes `true` for each null slot of `nulls[start..start + out.len()]`.
#[inline(always)]
fn expand_missing(nulls: &NullBuffer, start: usize, out: &mut [bool]) {
    let bits = nulls.inner();
    let chunks = bits.inner().bit_chunks(bits.offset() + start, out.len());
    let mut i = 0;
    for word in chunks.iter() {
        for (b, m) in out[i..i + 64].iter_mut().enumerate() {
            *m = (word >> b) & 1 == 0;
        }
        i += 64;
    }
    let rem = chunks.remainder_bits();
    for (b, m) in out[i..].iter_mut().enumerate() {
        *m = (rem >> b) & 1 == 0;
    }
}

/// Runs a body compiled with AVX-512 or AVX2 where the CPU has them, and plainly otherwise.
///
/// The kernels are generic Rust; compiling the same body again with wider vector
/// instructions enabled lets LLVM use them without making the binary require them.
macro_rules! dispatch {
    ($body:expr) => {{
        #[cfg(target_arch = "x86_64")]
        {
            #[target_feature(enable = "avx512f,avx512dq,avx512vl,avx2,fma")]
            fn avx512<R>(f: impl FnOnce() -> R) -> R {
                f()
            }
            #[target_feature(enable = "avx2,fma")]
            fn avx2<R>(f: impl FnOnce() -> R) -> R {
                f()
            }
            use std::arch::is_x86_feature_detected as has;
            if has!("avx512f")
                && has!("avx512dq")
                && has!("avx512vl")
                && has!("avx2")
                && has!("fma")
            {
                // SAFETY: the CPU was just checked to support every feature the function enables.
                return unsafe { avx512(|| $body) };
            }
            if has!("avx2") && has!("fma") {
                // SAFETY: the CPU was just checked to support AVX2 and FMA, the only
                // requirement of a `#[target_feature(enable = "avx2,fma")]` function.
                return unsafe { avx2(|| $body) };
            }
        }
        $body
    }};
}

/// Applies `ops` to every value and writes the results as float32 into
/// `out[row * stride + offset]`; values still missing at the end (null, never filled)
/// become NaN, since a dense tensor has no validity.
pub fn chain_to_f32(
    values: &[f64],
    nulls: Option<&NullBuffer>,
    ops: &[NumOp],
    out: &mut [f32],
    stride: usize,
    offset: usize,
) {
    assert!(
        offset < stride.max(1) && out.len() >= values.len() * stride,
        "output too small"
    );
    if let Some(affine_clip) = AffineClip::of(ops) {
        return dispatch!(affine_clip.to_f32(values, nulls, out, stride, offset));
    }
    dispatch!({
        for_each_chunk(values, nulls, ops, |start, buf, missing| {
            if stride == 1 {
                let out = &mut out[start..start + buf.len()];
                out.iter_mut().zip(buf).for_each(|(o, &v)| *o = v as f32);
                if let Some(missing) = missing {
                    out.iter_mut()
                        .zip(missing)
                        .for_each(|(o, &m)| *o = if m { f32::NAN } else { *o });
                }
            } else {
                let rows = out[start * stride..].chunks_exact_mut(stride);
                match missing {
                    None => rows.zip(buf).for_each(|(row, &v)| row[offset] = v as f32),
                    Some(missing) => {
                        rows.zip(buf.iter().zip(missing))
                            .for_each(|(row, (&v, &m))| {
                                row[offset] = if m { f32::NAN } else { v as f32 }
                            })
                    }
                }
            }
        })
    })
}

/// A chain of at most one affine step followed by at most one clip (standardize → clip,
/// min_max, a bare clip), run as one expression per value straight from the input into
/// the output: the general chain copies each chunk into a buffer and makes a pass per
/// step, which for so little arithmetic costs more than the arithmetic (standardize→clip
/// ran at ~2.6 G values/s that way). Same operations in the same order, so the same bits.
#[derive(Debug, Clone, Copy)]
struct AffineClip {
    sub: f64,
    mul: f64,
    lo: f64,
    hi: f64,
}

impl AffineClip {
    fn of(ops: &[NumOp]) -> Option<AffineClip> {
        // (x - 0) * 1 is x, and no value is below -inf or above +inf: the missing step is a
        // no-op, bit for bit, NaN included.
        let (affine, clip) = match ops {
            [NumOp::Affine { sub, mul }] => ((*sub, *mul), None),
            [NumOp::Clip { lo, hi }] => ((0.0, 1.0), Some((*lo, *hi))),
            [NumOp::Affine { sub, mul }, NumOp::Clip { lo, hi }] => {
                ((*sub, *mul), Some((*lo, *hi)))
            }
            _ => return None,
        };
        let (lo, hi) = clip.unwrap_or((f64::NEG_INFINITY, f64::INFINITY));
        Some(AffineClip {
            sub: affine.0,
            mul: affine.1,
            lo,
            hi,
        })
    }

    #[inline(always)]
    fn to_f32(
        self,
        values: &[f64],
        nulls: Option<&NullBuffer>,
        out: &mut [f32],
        stride: usize,
        offset: usize,
    ) {
        let AffineClip { sub, mul, lo, hi } = self;
        let f = |x: f64| {
            let v = (x - sub) * mul;
            (if v < lo {
                lo
            } else if v > hi {
                hi
            } else {
                v
            }) as f32
        };
        let nulls = nulls.filter(|n| n.null_count() > 0);
        let mut missing = [false; CHUNK];
        for (c, chunk) in values.chunks(CHUNK).enumerate() {
            let start = c * CHUNK;
            let missing = &mut missing[..chunk.len()];
            if let Some(n) = nulls {
                expand_missing(n, start, missing);
            }
            if stride == 1 {
                let out = &mut out[start..start + chunk.len()];
                out.iter_mut().zip(chunk).for_each(|(o, &x)| *o = f(x));
                if nulls.is_some() {
                    out.iter_mut()
                        .zip(missing.iter())
                        .for_each(|(o, &m)| *o = if m { f32::NAN } else { *o });
                }
            } else {
                let rows = out[start * stride..].chunks_exact_mut(stride);
                if nulls.is_some() {
                    rows.zip(chunk.iter().zip(missing.iter()))
                        .for_each(|(row, (&x, &m))| row[offset] = if m { f32::NAN } else { f(x) });
                } else {
                    rows.zip(chunk).for_each(|(row, &x)| row[offset] = f(x));
                }
            }
        }
    }
}

/// Applies `ops`, then writes the bucket index of each value: the number of `boundaries`
/// `<= x`. Missing values (null never filled, or NaN) get `boundaries.len() + 1`.
pub fn chain_to_bucket(
    values: &[f64],
    nulls: Option<&NullBuffer>,
    ops: &[NumOp],
    boundaries: &[f64],
    out: &mut [i64],
) {
    assert_eq!(values.len(), out.len(), "output length");
    let missing_bucket = boundaries.len() as i64 + 1;
    dispatch!({
        for_each_chunk(values, nulls, ops, |start, buf, missing| {
            let out = &mut out[start..start + buf.len()];
            for (o, &v) in out.iter_mut().zip(buf) {
                *o = if v.is_nan() {
                    missing_bucket
                } else {
                    boundaries.partition_point(|&b| b <= v) as i64
                };
            }
            if let Some(missing) = missing {
                out.iter_mut()
                    .zip(missing)
                    .for_each(|(o, &m)| *o = if m { missing_bucket } else { *o });
            }
        })
    })
}

/// Applies `ops` and hands every resulting value that is present (not missing) and finite
/// to `visit`, a chunk at a time: what fitting a later step needs to see.
pub fn chain_visit(
    values: &[f64],
    nulls: Option<&NullBuffer>,
    ops: &[NumOp],
    mut visit: impl FnMut(&[f64]),
) {
    let mut kept = Vec::with_capacity(CHUNK);
    dispatch!(for_each_chunk(values, nulls, ops, |_, buf, missing| {
        kept.clear();
        match missing {
            None => kept.extend(buf.iter().copied().filter(|v| v.is_finite())),
            Some(m) => kept.extend(
                buf.iter()
                    .zip(m)
                    .filter(|(v, m)| !**m && v.is_finite())
                    .map(|(v, _)| *v),
            ),
        }
        visit(&kept);
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference;

    fn random_column(n: usize, null_rate: f64, seed: u64) -> (Vec<f64>, Option<NullBuffer>) {
        use rand::{RngExt, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let specials = [
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            -1.0,
            -2.0,
            0.0,
            -0.0,
        ];
        let values: Vec<f64> = (0..n)
            .map(|_| {
                if rng.random_bool(0.05) {
                    specials[rng.random_range(0..specials.len())]
                } else {
                    (rng.random::<f64>() * 8.0 - 1.0).exp() - 0.5
                }
            })
            .collect();
        let valid: Vec<bool> = (0..n).map(|_| !rng.random_bool(null_rate)).collect();
        let nulls = if null_rate > 0.0 {
            Some(NullBuffer::from(valid))
        } else {
            None
        };
        (values, nulls)
    }

    fn same_f32(a: f32, b: f32) -> bool {
        (a.is_nan() && b.is_nan()) || a == b || (a - b).abs() <= 1e-6 * b.abs().max(1.0)
    }

    const CHAINS: &[&[NumOp]] = &[
        &[],
        &[
            NumOp::FillNull(0.0),
            NumOp::Log1p,
            NumOp::Affine { sub: 1.5, mul: 0.5 },
            NumOp::Clip { lo: -3.0, hi: 3.0 },
        ],
        &[
            NumOp::Affine {
                sub: -2.0,
                mul: 3.0,
            },
            NumOp::Clip { lo: -3.0, hi: 3.0 },
        ],
        &[NumOp::Log1p, NumOp::FillNull(7.0)],
        &[NumOp::Affine {
            sub: 0.5,
            mul: -2.0,
        }],
        &[NumOp::Clip { lo: -1.0, hi: 2.0 }],
        &[
            NumOp::Clip { lo: 0.0, hi: 1.0 },
            NumOp::FillNull(-1.0),
            NumOp::Log1p,
        ],
    ];

    #[test]
    fn f32_chain_matches_reference_at_every_size() {
        for &n in &[0usize, 1, 2, 63, 64, 65, 1023, 1024, 1025, 5000] {
            for &null_rate in &[0.0, 0.1, 0.5, 1.0] {
                let (values, nulls) =
                    random_column(n, null_rate, n as u64 * 31 + (null_rate * 10.0) as u64);
                for ops in CHAINS {
                    let mut out = vec![0f32; n];
                    chain_to_f32(&values, nulls.as_ref(), ops, &mut out, 1, 0);
                    for i in 0..n {
                        let valid = nulls.as_ref().is_none_or(|b| b.is_valid(i));
                        let want =
                            reference::chain(values[i], valid, ops).map_or(f32::NAN, |v| v as f32);
                        assert!(
                            same_f32(out[i], want),
                            "n={n} i={i} ops={ops:?}: {} vs {want}",
                            out[i]
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn affine_clip_fast_path_matches_the_general_chain_bit_for_bit() {
        let no_op = NumOp::Clip {
            lo: f64::NEG_INFINITY,
            hi: f64::INFINITY,
        };
        let fast: &[&[NumOp]] = &[
            &[
                NumOp::Affine { sub: 1.5, mul: 0.3 },
                NumOp::Clip { lo: -3.0, hi: 3.0 },
            ],
            &[NumOp::Affine {
                sub: -1.0,
                mul: 7.0,
            }],
            &[NumOp::Clip { lo: 0.0, hi: 10.0 }],
        ];
        for &n in &[1usize, 1023, 1025, 3000] {
            for &null_rate in &[0.0, 0.3] {
                let (values, nulls) = random_column(n, null_rate, n as u64 + 5);
                for ops in fast {
                    // Three steps are past the fast path: the general chain runs.
                    let general = [ops.to_vec(), vec![no_op, no_op]].concat();
                    for (stride, offset) in [(1, 0), (3, 2)] {
                        let mut a = vec![0f32; n * stride];
                        let mut b = vec![0f32; n * stride];
                        chain_to_f32(&values, nulls.as_ref(), ops, &mut a, stride, offset);
                        chain_to_f32(&values, nulls.as_ref(), &general, &mut b, stride, offset);
                        for (x, y) in a.iter().zip(&b) {
                            assert!(x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()));
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn chain_works_on_sliced_nulls() {
        // A validity bitmap that starts mid-byte, as a sliced array's does.
        let values: Vec<f64> = (0..300).map(|i| i as f64).collect();
        let valid: Vec<bool> = (0..303).map(|i| i % 3 != 0).collect();
        let nulls = NullBuffer::from(valid.clone()).slice(3, 300);
        let mut out = vec![0f32; 300];
        chain_to_f32(
            &values,
            Some(&nulls),
            &[NumOp::FillNull(-1.0)],
            &mut out,
            1,
            0,
        );
        for i in 0..300 {
            assert_eq!(out[i], if valid[i + 3] { i as f32 } else { -1.0 }, "i={i}");
        }
    }

    #[test]
    fn strided_output_interleaves_columns() {
        let values = [1.0, 2.0, 3.0];
        let mut out = vec![0f32; 6];
        chain_to_f32(&values, None, &[], &mut out, 2, 1);
        chain_to_f32(
            &values,
            Some(&NullBuffer::from(vec![true, false, true])),
            &[],
            &mut out,
            2,
            0,
        );
        assert!(out[2].is_nan());
        assert_eq!(
            [out[0], out[1], out[3], out[4], out[5]],
            [1.0, 1.0, 2.0, 3.0, 3.0]
        );
    }

    #[test]
    fn buckets_match_reference() {
        let boundaries = [-1.0, 0.0, 0.5, 2.0];
        for &n in &[0usize, 1, 2, 1500] {
            let (values, nulls) = random_column(n, 0.1, 7);
            let ops = [NumOp::Log1p];
            let mut out = vec![0i64; n];
            chain_to_bucket(&values, nulls.as_ref(), &ops, &boundaries, &mut out);
            for i in 0..n {
                let valid = nulls.as_ref().is_none_or(|b| b.is_valid(i));
                let want = reference::bucket(reference::chain(values[i], valid, &ops), &boundaries);
                assert_eq!(out[i], want, "i={i} x={}", values[i]);
            }
        }
    }

    #[test]
    fn visit_sees_present_finite_values_only() {
        let values = [1.0, f64::NAN, 3.0, f64::INFINITY, 5.0];
        let nulls = NullBuffer::from(vec![true, true, false, true, true]);
        let mut seen = Vec::new();
        chain_visit(&values, Some(&nulls), &[], |c| seen.extend_from_slice(c));
        assert_eq!(seen, vec![1.0, 5.0]);
        seen.clear();
        chain_visit(&values, Some(&nulls), &[NumOp::FillNull(2.0)], |c| {
            seen.extend_from_slice(c)
        });
        assert_eq!(seen, vec![1.0, 2.0, 5.0]);
    }

    #[test]
    fn zero_divisor_divides_by_one() {
        assert_eq!(
            NumOp::divide(2.0, 0.0),
            NumOp::Affine { sub: 2.0, mul: 1.0 }
        );
        assert_eq!(
            NumOp::divide(2.0, 4.0),
            NumOp::Affine {
                sub: 2.0,
                mul: 0.25
            }
        );
    }
}
