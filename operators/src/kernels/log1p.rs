//! A branch-free `ln(1 + x)` the compiler can vectorize.
//!
//! `f64::ln_1p` calls libm once per value, which no compiler turns into SIMD; the fused
//! numeric chain needs log1p at hundreds of millions of values per second, so this is
//! musl's (fdlibm's) log1p algorithm rewritten without branches: special cases are
//! selected at the end, and the two divisions share one reciprocal.

// fdlibm's constants, digit for digit as published.
#![allow(clippy::excessive_precision)]

const LN2_HI: f64 = 6.931_471_803_691_238_164_90e-01;
const LN2_LO: f64 = 1.908_214_929_270_587_700_02e-10;
const LG1: f64 = 6.666_666_666_666_735_130e-01;
const LG2: f64 = 3.999_999_999_940_941_908e-01;
const LG3: f64 = 2.857_142_874_366_239_149e-01;
const LG4: f64 = 2.222_219_843_214_978_396e-01;
const LG5: f64 = 1.818_357_216_161_805_012e-01;
const LG6: f64 = 1.531_383_769_920_937_332e-01;
const LG7: f64 = 1.479_819_860_511_658_591e-01;

/// `ln(1 + x)` to within a few ulps of `f64::ln_1p`, with the same special values:
/// NaN for NaN and `x < -1`, `-inf` at `-1`, `+inf` at `+inf`.
#[inline(always)]
pub fn log1p(x: f64) -> f64 {
    let u = 1.0 + x;
    // Split u = 2^k * m with m in [sqrt(2)/2, sqrt(2)), as musl does: shift the
    // exponent so that the mantissa range straddles 1.
    let ix = u
        .to_bits()
        .wrapping_add(0x3ff0_0000_0000_0000 - 0x3fe6_a09e_667f_3bcd);
    let k = (ix >> 52) as i64 - 0x3ff;
    let m = f64::from_bits((ix & 0x000f_ffff_ffff_ffff) + 0x3fe6_a09e_667f_3bcd);
    let f = m - 1.0;
    // One division gives both 1/(2+f) and 1/u.
    let q = 1.0 / ((2.0 + f) * u);
    let inv_2f = q * u;
    let inv_u = q * (2.0 + f);
    // u = 1 + x was rounded; c is the part of x it lost, carried as a first-order term.
    let c = if k >= 2 { 1.0 - (u - x) } else { x - (u - 1.0) };
    let c = if k < 54 { c * inv_u } else { 0.0 };
    let hfsq = 0.5 * f * f;
    let s = f * inv_2f;
    let z = s * s;
    let w = z * z;
    let t1 = w * (LG2 + w * (LG4 + w * LG6));
    let t2 = z * (LG1 + w * (LG3 + w * (LG5 + w * LG7)));
    let r = t2 + t1;
    let dk = k as f64;
    let y = s * (hfsq + r) + (dk * LN2_LO + c) - hfsq + f + dk * LN2_HI;
    // Special values, selected rather than branched on.
    let y = if u == f64::INFINITY { f64::INFINITY } else { y };
    let y = if u == 0.0 { f64::NEG_INFINITY } else { y };
    // Exactly representable tiny x: 1 + x rounds to 1 and ln(1 + x) = x.
    let y = if u == 1.0 { x } else { y };
    if u >= 0.0 { y } else { f64::NAN }
}

#[cfg(test)]
mod tests {
    use super::log1p;

    fn close(a: f64, b: f64) -> bool {
        (a.is_nan() && b.is_nan())
            || a == b
            || ((a - b).abs() <= 4.0 * f64::EPSILON * b.abs().max(f64::MIN_POSITIVE))
    }

    #[test]
    fn matches_std_on_special_values() {
        for x in [
            0.0,
            -0.0,
            -1.0,
            -1.5,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
            1e-300,
            -1e-300,
            1e-20,
            -1e-17,
            f64::MAX,
            f64::MIN_POSITIVE,
            -0.999_999_999_999,
            1.0,
            0.5,
            -0.5,
            1e10,
            1e300,
        ] {
            assert!(
                close(log1p(x), x.ln_1p()),
                "x={x}: {} vs {}",
                log1p(x),
                x.ln_1p()
            );
        }
    }

    #[test]
    fn matches_std_across_magnitudes() {
        // A deterministic sweep over many magnitudes and both signs (> -1).
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..200_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let mantissa = (state >> 11) as f64 / (1u64 << 53) as f64;
            let exp = ((state & 0xff) as i32) - 128;
            let x = mantissa * 2f64.powi(exp);
            let x = if state & 0x100 != 0 {
                -x.min(0.999_999)
            } else {
                x
            };
            assert!(
                close(log1p(x), x.ln_1p()),
                "x={x}: {} vs {}",
                log1p(x),
                x.ln_1p()
            );
        }
    }
}
