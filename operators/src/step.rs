//! Feature steps as written in a pipeline file: `fill_null(0)`, `log1p`, `clip(-3, 3)`,
//! `vocab(max_size=1000, min_count=2)`, ...
//!
//! A step is written as a name with optional arguments in parentheses, positional
//! (numbers) or named (`key=number`). Parsing checks the arguments; whether a step fits
//! a column is checked later, when the plan is compiled against the input schema.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::{OpError, Result};

/// One transform in a feature group's chain.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Replace nulls by a constant.
    FillNull(f64),
    /// `ln(1 + x)`.
    Log1p,
    /// `(x - mean) / std` with the fitted population mean and std (a zero std divides by 1).
    Standardize,
    /// `(x - min) / (max - min)` with the fitted min and max (an empty range divides by 1).
    MinMax,
    /// Clamp into `[lo, hi]`; NaN stays NaN.
    Clip(f64, f64),
    /// The index of the bucket `x` falls in: the number of boundaries `<= x`.
    /// Missing values (null or NaN) go to the extra bucket `boundaries.len() + 1`.
    Bucketize(Vec<f64>),
    /// Bucketize with `n` buckets whose boundaries are fitted quantiles.
    QuantileBucketize(usize),
    /// A fitted vocabulary index: 0 = most frequent; unseen and null map to its size.
    Vocab {
        /// Keep at most this many values (the most frequent).
        max_size: Option<usize>,
        /// Keep only values seen at least this many times.
        min_count: u64,
    },
    /// `xxhash64(utf8 bytes, seed 0) mod n`; null maps to `n`.
    HashBucket(u64),
    /// Expand an index in `[0, n)` into `n` float columns of 0/1; other indices give all zeros.
    OneHot(usize),
}

impl Step {
    /// Whether this step learns parameters from the data.
    pub fn is_fitted(&self) -> bool {
        matches!(
            self,
            Step::Standardize | Step::MinMax | Step::QuantileBucketize(_) | Step::Vocab { .. }
        )
    }

    /// Parses one step as written in a pipeline file.
    pub fn parse(text: &str) -> Result<Step> {
        let bad = |reason: &str| OpError::BadStep {
            step: crate::error::quoted(text),
            // Reasons repeat parts of the text (`x` is not a number).
            reason: crate::error::quoted(reason),
        };
        let text_t = text.trim();
        let (name, args) = match text_t.find('(') {
            None => (text_t, Vec::new()),
            Some(open) => {
                let inner = text_t[open + 1..]
                    .strip_suffix(')')
                    .ok_or_else(|| bad("missing `)`"))?;
                let args = if inner.trim().is_empty() {
                    Vec::new()
                } else {
                    inner
                        .split(',')
                        .map(|a| Arg::parse(a).map_err(|r| bad(&r)))
                        .collect::<Result<Vec<_>>>()?
                };
                (text_t[..open].trim(), args)
            }
        };
        let args = Args { args, bad: &bad };
        let step = match name {
            "fill_null" => Step::FillNull(args.exactly_one()?),
            "log1p" => args.none(Step::Log1p)?,
            "standardize" => args.none(Step::Standardize)?,
            "min_max" => args.none(Step::MinMax)?,
            "clip" => {
                let [lo, hi] = args.positional::<2>()?;
                if lo.is_nan() || hi.is_nan() {
                    return Err(bad("needs numbers for its bounds, not NaN"));
                }
                if lo > hi {
                    return Err(bad("needs lo <= hi"));
                }
                Step::Clip(lo, hi)
            }
            "bucketize" => {
                let b = args.all_positional()?;
                if b.is_empty()
                    || b.iter().any(|x| !x.is_finite())
                    || b.windows(2).any(|w| w[0] >= w[1])
                {
                    return Err(bad(
                        "needs one or more finite boundaries in ascending order",
                    ));
                }
                Step::Bucketize(b)
            }
            "quantile_bucketize" => Step::QuantileBucketize(args.count("n", 2, 1 << 16)? as usize),
            "vocab" => {
                let max_size = args
                    .named("max_size")?
                    .map(|v| to_count(v, 1, u32::MAX as u64))
                    .transpose();
                let min_count = args
                    .named("min_count")?
                    .map(|v| to_count(v, 1, u64::MAX))
                    .transpose();
                args.only_named(&["max_size", "min_count"])?;
                Step::Vocab {
                    max_size: max_size
                        .map_err(|r| bad(&format!("max_size {r}")))?
                        .map(|v| v as usize),
                    min_count: min_count
                        .map_err(|r| bad(&format!("min_count {r}")))?
                        .unwrap_or(1),
                }
            }
            "hash_bucket" => Step::HashBucket(args.count("n", 1, 1 << 62)?),
            "one_hot" => Step::OneHot(args.count("n", 1, 1 << 16)? as usize),
            "" => return Err(bad("empty step")),
            _ => {
                return Err(bad(
                    "unknown step (known: fill_null, log1p, standardize, min_max, clip, bucketize, \
                     quantile_bucketize, vocab, hash_bucket, one_hot)",
                ));
            }
        };
        Ok(step)
    }
}

/// Above this a float no longer holds every whole number, so larger counts are read from
/// their digits.
const EXACT_IN_F64: f64 = (1u64 << 53) as f64;

fn to_count(n: &Number, lo: u64, hi: u64) -> std::result::Result<u64, String> {
    // Digits are read exactly: `hash_bucket(4611686018427387905)` must not become 2^62.
    let exact = n.text.parse::<u64>().ok().or_else(|| {
        (n.value.fract() == 0.0 && (0.0..=EXACT_IN_F64).contains(&n.value))
            .then_some(n.value as u64)
    });
    match exact {
        Some(v) if (lo..=hi).contains(&v) => Ok(v),
        None if n.value.fract() == 0.0 && n.value > EXACT_IN_F64 => Err(format!(
            "must be a whole number in [{lo}, {hi}] written in digits, got {}",
            n.text
        )),
        _ => Err(format!(
            "must be a whole number in [{lo}, {hi}], got {}",
            n.text
        )),
    }
}

/// A number argument as written, and its value.
struct Number {
    text: String,
    value: f64,
}

enum Arg {
    Pos(Number),
    Named(String, Number),
}

impl Arg {
    fn parse(text: &str) -> std::result::Result<Arg, String> {
        let number = |s: &str| {
            let text = s.trim();
            let value = text
                .parse::<f64>()
                .map_err(|_| format!("`{text}` is not a number"))?;
            // `1e400` parses as infinity: said, where `inf` written out is meant so.
            let spelled = text.trim_start_matches(['+', '-']).to_ascii_lowercase();
            if value.is_infinite() && !matches!(spelled.as_str(), "inf" | "infinity") {
                return Err(format!(
                    "`{text}` is beyond a 64-bit float's range (write inf if that is meant)"
                ));
            }
            // `1e-400` parses as 0: said too, where a digit before the exponent is not 0.
            let mantissa = spelled.split('e').next().unwrap_or_default();
            if value == 0.0 && mantissa.bytes().any(|b| matches!(b, b'1'..=b'9')) {
                return Err(format!(
                    "`{text}` is too small for a 64-bit float: it would be read as 0 (write 0 \
                     if that is meant)"
                ));
            }
            Ok(Number {
                text: text.to_string(),
                value,
            })
        };
        match text.split_once('=') {
            Some((k, v)) => Ok(Arg::Named(k.trim().to_string(), number(v)?)),
            None => Ok(Arg::Pos(number(text)?)),
        }
    }
}

struct Args<'a> {
    args: Vec<Arg>,
    bad: &'a dyn Fn(&str) -> OpError,
}

impl Args<'_> {
    fn none(&self, step: Step) -> Result<Step> {
        if self.args.is_empty() {
            Ok(step)
        } else {
            Err((self.bad)("takes no arguments"))
        }
    }

    fn all_positional(&self) -> Result<Vec<f64>> {
        self.args
            .iter()
            .map(|a| match a {
                Arg::Pos(n) => Ok(n.value),
                Arg::Named(k, _) => Err((self.bad)(&format!("unknown argument `{k}`"))),
            })
            .collect()
    }

    fn positional<const N: usize>(&self) -> Result<[f64; N]> {
        let v = self.all_positional()?;
        v.try_into()
            .map_err(|_| (self.bad)(&format!("takes {N} argument(s)")))
    }

    fn exactly_one(&self) -> Result<f64> {
        let [v] = self.positional::<1>()?;
        Ok(v)
    }

    /// One whole-number argument, positional or named `name=`.
    fn count(&self, name: &str, lo: u64, hi: u64) -> Result<u64> {
        let n = match self.args.as_slice() {
            [Arg::Pos(n)] => n,
            [Arg::Named(k, n)] if k == name => n,
            _ => return Err((self.bad)(&format!("takes one argument `{name}`"))),
        };
        to_count(n, lo, hi).map_err(|r| (self.bad)(&format!("{name} {r}")))
    }

    fn named(&self, name: &str) -> Result<Option<&Number>> {
        let mut found = None;
        for a in &self.args {
            match a {
                Arg::Named(k, n) if k == name => {
                    if found.replace(n).is_some() {
                        return Err((self.bad)(&format!("`{name}` given twice")));
                    }
                }
                Arg::Pos(_) => return Err((self.bad)("takes only named arguments")),
                Arg::Named(..) => {}
            }
        }
        Ok(found)
    }

    fn only_named(&self, known: &[&str]) -> Result<()> {
        for a in &self.args {
            if let Arg::Named(k, _) = a
                && !known.contains(&k.as_str())
            {
                return Err((self.bad)(&format!(
                    "unknown argument `{k}` (known: {})",
                    known.join(", ")
                )));
            }
        }
        Ok(())
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::FillNull(v) => write!(f, "fill_null({v})"),
            Step::Log1p => f.write_str("log1p"),
            Step::Standardize => f.write_str("standardize"),
            Step::MinMax => f.write_str("min_max"),
            Step::Clip(lo, hi) => write!(f, "clip({lo}, {hi})"),
            Step::Bucketize(b) => {
                let b: Vec<String> = b.iter().map(|x| x.to_string()).collect();
                write!(f, "bucketize({})", b.join(", "))
            }
            Step::QuantileBucketize(n) => write!(f, "quantile_bucketize({n})"),
            Step::Vocab {
                max_size,
                min_count,
            } => {
                let mut args = Vec::new();
                if let Some(m) = max_size {
                    args.push(format!("max_size={m}"));
                }
                if *min_count != 1 {
                    args.push(format!("min_count={min_count}"));
                }
                if args.is_empty() {
                    f.write_str("vocab")
                } else {
                    write!(f, "vocab({})", args.join(", "))
                }
            }
            Step::HashBucket(n) => write!(f, "hash_bucket({n})"),
            Step::OneHot(n) => write!(f, "one_hot({n})"),
        }
    }
}

impl Serialize for Step {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Step {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Step::parse(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_step_and_prints_it_back() {
        for text in [
            "fill_null(0)",
            "log1p",
            "standardize",
            "min_max",
            "clip(-3, 3)",
            "bucketize(0, 1.5, 10)",
            "quantile_bucketize(8)",
            "vocab",
            "vocab(max_size=1000, min_count=2)",
            "hash_bucket(262144)",
            "one_hot(4)",
        ] {
            let step = Step::parse(text).unwrap();
            assert_eq!(Step::parse(&step.to_string()).unwrap(), step, "{text}");
        }
        assert_eq!(
            Step::parse(" clip( -1 ,2 ) ").unwrap(),
            Step::Clip(-1.0, 2.0)
        );
        assert_eq!(
            Step::parse("hash_bucket(n=16)").unwrap(),
            Step::HashBucket(16)
        );
        // Whole numbers are read from their digits, exactly, or from a float up to 2^53.
        assert_eq!(
            Step::parse("hash_bucket(9007199254740993)").unwrap(),
            Step::HashBucket(9_007_199_254_740_993)
        );
        assert_eq!(
            Step::parse("vocab(min_count=18446744073709551615)").unwrap(),
            Step::Vocab {
                max_size: None,
                min_count: u64::MAX
            }
        );
        assert_eq!(Step::parse("one_hot(1e3)").unwrap(), Step::OneHot(1000));
        // A bound left open is written out as infinity.
        assert_eq!(
            Step::parse("clip(-Infinity, inf)").unwrap(),
            Step::Clip(f64::NEG_INFINITY, f64::INFINITY)
        );
        // Zero written with an exponent is zero; the smallest subnormal is not refused.
        assert_eq!(
            Step::parse("clip(-0e500, 0.00e-7)").unwrap(),
            Step::Clip(0.0, 0.0)
        );
        assert_eq!(
            Step::parse("fill_null(5e-324)").unwrap(),
            Step::FillNull(5e-324)
        );
    }

    #[test]
    fn rejects_bad_steps_naming_the_problem() {
        for (text, needle) in [
            ("frobnicate", "unknown step"),
            ("clip(3, -3)", "lo <= hi"),
            ("clip(nan, 3)", "not NaN"),
            (
                "clip(-1e400, 3)",
                "`-1e400` is beyond a 64-bit float's range",
            ),
            ("fill_null(1e309)", "beyond"),
            ("fill_null(-2.5e-400)", "`-2.5e-400` is too small"),
            ("clip(1)", "takes 2"),
            ("fill_null", "takes 1"),
            ("fill_null(x)", "not a number"),
            ("log1p(2)", "no arguments"),
            ("bucketize(2, 1)", "ascending"),
            ("bucketize()", "ascending"),
            ("hash_bucket(0)", "whole number"),
            ("hash_bucket(1.5)", "whole number"),
            // Beyond 2^53 a float rounds: these were taken as 2^62 and 2^53.
            (
                "hash_bucket(4611686018427387905)",
                "got 4611686018427387905",
            ),
            ("hash_bucket(1e17)", "written in digits"),
            (
                "hash_bucket(18446744073709551615)",
                "got 18446744073709551615",
            ),
            ("one_hot", "one argument"),
            ("vocab(size=3)", "unknown argument"),
            ("vocab(max_size=0)", "max_size"),
            ("clip(1, 2", "missing `)`"),
            ("", "empty"),
        ] {
            let err = Step::parse(text).unwrap_err().to_string();
            assert!(err.contains(needle), "{text}: {err}");
        }
    }

    #[test]
    fn errors_are_one_bounded_line_whatever_the_text() {
        // Found by fuzzing: the step and the reason repeated the text raw, newlines and all.
        for text in ["c(\0\0\n=b\0\n)", " ,l3\0\n(10)", &"x\n".repeat(5000)] {
            let err = Step::parse(text).unwrap_err().to_string();
            assert!(!err.contains('\n'), "{err}");
            assert!(err.len() < 1000, "{}", err.len());
        }
    }
}
