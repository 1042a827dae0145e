//! `hydrant gen criteo`: a Criteo-like click log, written as Parquet a row group at a time
//! (memory stays flat whatever the row count).
//!
//! Columns as in ../shared/bench/gen_criteo.py: `label` int32, `i0..i12` float64
//! (lognormal(1, 1.5), ~10% nulls), `c0..c25` utf8 (Zeta(1.3) ids modulo cardinalities
//! 10, 100, 1k, 10k, 100k, written as two digits of the column then eight of the id).
//! Unlike that script's random label, this label depends on the features through a
//! logistic model, so a model trained on the stream can learn something.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use arrow::array::{ArrayRef, Float64Array, Int32Array, RecordBatch, StringBuilder};
use arrow::datatypes::{DataType, Field, Schema};
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use rand_distr::{Distribution, LogNormal, Zeta};

use crate::error::{Error, Result, one_line};

/// Numeric columns.
pub const NUMERIC: usize = 13;
/// Categorical columns.
pub const CATEGORICAL: usize = 26;
/// Rows per row group (and per generated chunk).
pub const ROW_GROUP: usize = 65_536;
const CARDINALITIES: [u64; 5] = [10, 100, 1_000, 10_000, 100_000];

/// The generated file's schema.
pub fn criteo_schema() -> Arc<Schema> {
    let mut fields = vec![Field::new("label", DataType::Int32, false)];
    fields.extend((0..NUMERIC).map(|i| Field::new(format!("i{i}"), DataType::Float64, true)));
    fields.extend((0..CATEGORICAL).map(|j| Field::new(format!("c{j}"), DataType::Utf8, false)));
    Arc::new(Schema::new(fields))
}

/// Writes `rows` Criteo-like rows to `out` in row groups of [`ROW_GROUP`] rows; the same
/// seed gives the same file.
pub fn criteo(rows: u64, out: &Path, seed: u64) -> Result<()> {
    criteo_with_row_groups(rows, out, seed, ROW_GROUP)
}

/// [`criteo`] with row groups of at most `row_group_rows` rows (the rows are the same
/// for a seed whatever the row groups).
pub fn criteo_with_row_groups(
    rows: u64,
    out: &Path,
    seed: u64,
    row_group_rows: usize,
) -> Result<()> {
    if row_group_rows == 0 {
        return Err(Error::Usage("row groups need at least one row".into()));
    }
    // The file written, not an input (found by a hostile run: "input x.parquet: No such
    // file or directory" for a `--out` in a folder that does not exist).
    let err = |e: &dyn std::fmt::Display| {
        Error::Usage(format!("--out {}: {}", out.display(), one_line(e)))
    };
    let schema = criteo_schema();
    let file = File::create(out).map_err(|e| err(&e))?;
    let props = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .set_max_row_group_row_count(Some(row_group_rows))
        .build();
    let mut writer =
        ArrowWriter::try_new(file, schema.clone(), Some(props)).map_err(|e| err(&e))?;
    let mut rng = StdRng::seed_from_u64(seed);
    let lognormal = LogNormal::new(1.0, 1.5).map_err(|e| err(&e))?;
    let zeta = Zeta::new(1.3).map_err(|e| err(&e))?;
    let mut left = rows;
    while left > 0 {
        let n = left.min(ROW_GROUP as u64) as usize;
        left -= n as u64;
        let mut logit = vec![-1.2f64; n];
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(1 + NUMERIC + CATEGORICAL);
        for i in 0..NUMERIC {
            let values: Vec<Option<f64>> = (0..n)
                .map(|_| {
                    let v: f64 = lognormal.sample(&mut rng);
                    if rng.random_bool(0.1) { None } else { Some(v) }
                })
                .collect();
            if i < 4 {
                // The first numeric features push the click probability up or down.
                let w = [0.9, -0.6, 0.5, 0.3][i];
                for (l, v) in logit.iter_mut().zip(&values) {
                    *l += w * (v.unwrap_or(0.0).ln_1p() - 1.2) / 0.9;
                }
            }
            columns.push(Arc::new(Float64Array::from(values)));
        }
        let mut cats = Vec::with_capacity(CATEGORICAL);
        for j in 0..CATEGORICAL {
            let card = CARDINALITIES[j % 5];
            let mut b = StringBuilder::with_capacity(n, n * 10);
            for l in logit.iter_mut() {
                let id = (zeta.sample(&mut rng) as u64) % card;
                if j < 3 {
                    // A few categorical features carry signal: each id has its own effect.
                    let effect = (mix(id, j as u64) % 9) as f64 / 4.0 - 1.0;
                    *l += 0.7 * effect;
                }
                b.append_value(format!("{j:02}{id:08}"));
            }
            cats.push(Arc::new(b.finish()) as ArrayRef);
        }
        let labels: Vec<i32> = logit
            .iter()
            .map(|l| rng.random_bool(1.0 / (1.0 + (-l).exp())) as i32)
            .collect();
        let mut all: Vec<ArrayRef> = vec![Arc::new(Int32Array::from(labels))];
        all.extend(columns);
        all.extend(cats);
        let batch = RecordBatch::try_new(schema.clone(), all).map_err(|e| err(&e))?;
        writer.write(&batch).map_err(|e| err(&e))?;
    }
    writer.close().map_err(|e| err(&e))?;
    Ok(())
}

/// A cheap integer mix (splitmix64), enough to give each id a fixed pseudo-random effect.
fn mix(id: u64, salt: u64) -> u64 {
    let mut z = id
        .wrapping_add(salt.wrapping_mul(0x9e37_79b9_7f4a_7c15))
        .wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
