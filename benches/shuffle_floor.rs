//! The floor under a window shuffle's cost, as memory traffic alone: no hydrant code runs,
//! only the copies any row-level shuffle within windows must make. Rows are 272 bytes, a
//! featurized Criteo row with its row id.
//!
//! - *in order*: each step's rows are written (the featurizing stand-in) straight into a
//!   step buffer that is then copied out (the loader's stand-in) and reused, so the rows
//!   never leave the caches;
//! - *shuffled*: a read batch's rows are written into a buffer kept hot, then each row is
//!   stored in its slot of the rank's window (65,536 rows, 17.8 MB a rank: past the caches)
//!   with streaming stores, as hydrant's strided path does, and the window's steps are
//!   copied out once it is whole.
//!
//! Window buffers are allocated and touched before timing, so first-touch page faults (a
//! window per rank that in-order delivery does not need) are not counted here either. The
//! difference per row is what no implementation can take off the shuffled path; compare it
//! with `hydrant run --shuffle` against in order (bench/analysis.md). `cargo bench --bench
//! shuffle_floor`.

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use hydrant::delivery::Permutation;
use hydrant::operators::kernels::rows::{store_fence, stream_out};

/// Bytes of a row: label 4, dense 13 × 4, ids 26 × 8, row id 8.
const ROW: usize = 272;
/// Rows of a rank's step.
const STEP: usize = 4096;
/// Rows a reader featurizes at a time.
const READ: usize = 8192;
/// Rows of a rank's shuffle window (hydrant's default).
const WINDOW: usize = 65_536;
const RANKS: usize = 2;
/// Rows of an epoch.
const ROWS: usize = 1 << 20;

/// The featurizing stand-in: writes every byte of `out`'s rows, row `first` on.
fn featurize(out: &mut [u8], first: usize) {
    for (i, row) in out.chunks_exact_mut(ROW).enumerate() {
        let v = (first + i) as u64;
        for (w, word) in row.chunks_exact_mut(8).enumerate() {
            word.copy_from_slice(&v.wrapping_mul(w as u64).to_le_bytes());
        }
    }
}

/// A fixed permutation of `0..n`: where each row of a window goes.
fn permutation(n: usize) -> Vec<usize> {
    let p = Permutation::new(n as u64, 42);
    (0..n as u64).map(|x| p.apply(x) as usize).collect()
}

fn in_order(steps: &mut [Vec<u8>], staging: &mut [u8]) {
    for (s, first) in (0..ROWS).step_by(STEP).enumerate() {
        let step = &mut steps[s % steps.len()];
        featurize(step, first);
        staging.copy_from_slice(step);
        black_box(&staging);
    }
}

fn shuffled(windows: &mut [Vec<u8>], scratch: &mut [u8], staging: &mut [u8], perm: &[usize]) {
    let per_rank = ROWS / RANKS;
    for rank in 0..RANKS {
        for (w, start) in (0..per_rank).step_by(WINDOW).enumerate() {
            // One window filling while the one before goes out, per rank.
            let window = &mut windows[rank * 2 + w % 2];
            for read in (0..WINDOW).step_by(READ) {
                featurize(scratch, start + read);
                for (i, row) in scratch.chunks_exact(ROW).enumerate() {
                    let slot = perm[read + i];
                    let dst = &mut window[slot * ROW..][..ROW];
                    // SAFETY: `dst` is `ROW` writable bytes of `window`, apart from `row`.
                    unsafe { stream_out(dst.as_mut_ptr(), row) };
                }
            }
            store_fence();
            for step in window.chunks_exact(STEP * ROW) {
                staging.copy_from_slice(step);
                black_box(&staging);
            }
        }
    }
}

fn benches(c: &mut Criterion) {
    let mut g = c.benchmark_group("shuffle_floor");
    g.sample_size(10);
    g.throughput(Throughput::Elements(ROWS as u64));
    let mut staging = vec![0u8; STEP * ROW];
    let mut steps = vec![vec![1u8; STEP * ROW]; 8];
    g.bench_function(
        "in order: rows written into reused steps, copied out",
        |b| b.iter(|| in_order(&mut steps, &mut staging)),
    );
    let mut windows = vec![vec![1u8; WINDOW * ROW]; 2 * RANKS];
    let mut scratch = vec![0u8; READ * ROW];
    let perm = permutation(WINDOW);
    g.bench_function(
        "shuffled: rows streamed into a 65,536-row window, copied out",
        |b| b.iter(|| shuffled(&mut windows, &mut scratch, &mut staging, &perm)),
    );
    g.finish();
}

criterion_group!(shuffle_floor, benches);
criterion_main!(shuffle_floor);
