//! A pool of threads that copy host memory in parallel (the cuda loader's fill of its
//! pinned staging buffers). The threads live as long as the pool: on the H100 machine of
//! `scripts/gpu-check`, starting a scoped thread per share of each batch left the fill at
//! ~15 GB/s, about what one thread's memcpy gives (9 GB/s); sixteen threads' memcpy reaches
//! ~43 GB/s. Written by hand: the copy needs no more than a few channels, and a general
//! pool (rayon) is not otherwise in the dependency tree.
//!
//! The threads copy with streaming (non-temporal) stores, which `memcpy` does not use at
//! these sizes: nothing on the CPU reads a staging buffer again, so reading each
//! destination line into the cache before writing it is wasted memory traffic, and the
//! DMA out of the other buffer competes for the same memory. On that machine the
//! loader's steady rate (32 batches of 16.5 MB) went from 0.70–0.77× of a bare pinned
//! copy with `memcpy` to 0.79–0.82× (AVX-512 stores gave no more than SSE2's, which need
//! no feature detection).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender, bounded};

/// The least a thread is given: below this, handing it over costs more than the memcpy.
const MIN_SHARE_BYTES: usize = 1 << 20;

/// The pieces threads take one at a time: small enough that a thread the machine stalls
/// (a busy core, a virtual machine's steal) holds up the round by one chunk, not a share.
/// On the (noisy, virtual) H100 machine, six paired runs of the loader's throughput test
/// gave a median of 39.5 GB/s this way against 32 GB/s with one equal share per thread.
const CHUNK_BYTES: usize = 256 << 10;

/// One round of copying: (destination, source, length) chunks, each taken by whichever
/// thread asks for the next one first.
struct Round {
    chunks: Vec<(*mut u8, *const u8, usize)>,
    next: AtomicUsize,
}

impl Round {
    /// Copies chunks until none is left.
    fn work(&self) {
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            let Some(&(dst, src, len)) = self.chunks.get(i) else {
                return;
            };
            // SAFETY: `CopyPool::copy` made each chunk from a `&mut [u8]` and a `&[u8]`
            // of at least `len` bytes that do not overlap (one is borrowed mutably); each
            // is taken by one thread only (the counter); and `copy` does not return
            // before every thread it handed the round to is done (see `Pending`).
            unsafe { stream_copy(dst, src, len) };
        }
    }
}

/// A round handed to a pool thread.
struct Job(*const Round);

// SAFETY: the round behind the pointer outlives every job made from it (`CopyPool::copy`
// waits for them), and a round is only shared through `&`: its chunks are claimed through
// an atomic counter.
unsafe impl Send for Job {}

/// Threads that copy the pieces of [`CopyPool::copy`], with the calling thread.
pub(crate) struct CopyPool {
    jobs: Vec<Sender<Job>>,
    done: Receiver<()>,
    threads: Vec<JoinHandle<()>>,
}

impl CopyPool {
    /// A pool that copies on `threads` threads in all: the caller and `threads - 1` more.
    pub(crate) fn new(threads: usize) -> Self {
        let (done_tx, done) = bounded(threads);
        let mut jobs = Vec::new();
        let mut handles = Vec::new();
        for _ in 1..threads.max(1) {
            let (tx, rx) = bounded::<Job>(1);
            let done_tx = done_tx.clone();
            handles.push(std::thread::spawn(move || {
                for Job(round) in rx {
                    // SAFETY: see `Job`: the round lives until this thread says it is done.
                    unsafe { &*round }.work();
                    if done_tx.send(()).is_err() {
                        return;
                    }
                }
            }));
            jobs.push(tx);
        }
        CopyPool {
            jobs,
            done,
            threads: handles,
        }
    }

    /// Copies each `(dst, src)` pair (equal lengths) on as many of the pool's threads as
    /// there are [`MIN_SHARE_BYTES`] to copy, in chunks of [`CHUNK_BYTES`].
    pub(crate) fn copy(&self, pieces: &mut [(&mut [u8], &[u8])]) {
        let total: usize = pieces.iter().map(|(_, s)| s.len()).sum();
        let threads = (self.jobs.len() + 1).min(total / MIN_SHARE_BYTES).max(1);
        let round = Round {
            chunks: chunks(pieces, CHUNK_BYTES),
            next: AtomicUsize::new(0),
        };
        // Declared after `round`, so dropped before it: waits, even if this thread
        // unwinds, until every thread handed the round is done with it.
        let mut pending = Pending {
            done: &self.done,
            count: 0,
        };
        for jobs in &self.jobs[..threads - 1] {
            // A thread that is gone (it cannot be while the pool lives) leaves its part
            // of the round to the others.
            if jobs.send(Job(&round)).is_ok() {
                pending.count += 1;
            }
        }
        round.work();
    }
}

impl Drop for CopyPool {
    fn drop(&mut self) {
        self.jobs.clear(); // the threads' loops end
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// `len` bytes from `src` to `dst` with non-temporal (streaming) stores: the destination
/// is written straight to memory, without first reading each cache line in and without
/// evicting the cache, since no CPU reads a staging buffer again (the DMA engine does).
///
/// # Safety
/// As `ptr::copy_nonoverlapping`: `src` readable and `dst` writable for `len` bytes, not
/// overlapping.
#[cfg(target_arch = "x86_64")]
unsafe fn stream_copy(dst: *mut u8, src: *const u8, len: usize) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
    // SAFETY: the caller's contract; every access below stays within the `len` bytes, and
    // the streamed stores go to 16-byte aligned addresses (`head` aligns `d`). SSE2 is
    // part of x86_64.
    unsafe {
        let head = dst.align_offset(16).min(len);
        std::ptr::copy_nonoverlapping(src, dst, head);
        let (mut d, mut s, mut left) = (dst.add(head), src.add(head), len - head);
        while left >= 64 {
            let v = [0, 16, 32, 48].map(|at| _mm_loadu_si128(s.add(at).cast::<__m128i>()));
            for (at, v) in [0, 16, 32, 48].into_iter().zip(v) {
                _mm_stream_si128(d.add(at).cast::<__m128i>(), v);
            }
            (d, s, left) = (d.add(64), s.add(64), left - 64);
        }
        std::ptr::copy_nonoverlapping(s, d, left);
        // Streamed stores are weakly ordered: they must be visible before this thread
        // reports its chunks done (and the DMA that reads them is queued).
        _mm_sfence();
    }
}

/// Elsewhere, a plain copy.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn stream_copy(dst: *mut u8, src: *const u8, len: usize) {
    // SAFETY: the caller's contract.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) }
}

/// Counts the jobs still out; waits for them when dropped.
struct Pending<'a> {
    done: &'a Receiver<()>,
    count: usize,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        for _ in 0..self.count {
            if self.done.recv().is_err() {
                // Every thread is gone (none holds a sender): none can still be copying.
                return;
            }
        }
    }
}

/// The pieces cut into chunks of at most `chunk` bytes, as raw triples (see [`Round`]).
fn chunks(pieces: &mut [(&mut [u8], &[u8])], chunk: usize) -> Vec<(*mut u8, *const u8, usize)> {
    let mut out = Vec::new();
    for (dst, src) in pieces.iter_mut() {
        assert_eq!(dst.len(), src.len(), "a copy's two sides differ in length");
        for at in (0..src.len()).step_by(chunk) {
            let n = chunk.min(src.len() - at);
            out.push((dst[at..].as_mut_ptr(), src[at..].as_ptr(), n));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{CopyPool, stream_copy};

    #[test]
    fn a_streamed_copy_equals_memcpy_at_any_alignment_and_length() {
        let src: Vec<u8> = (0..4096).map(|i| (i * 31 % 253) as u8).collect();
        for len in [0, 1, 15, 16, 17, 63, 64, 65, 127, 1000, 4000] {
            for (d_at, s_at) in [(0, 0), (1, 0), (0, 3), (7, 9), (15, 1)] {
                let mut dst = vec![0xAAu8; 4096 + 32];
                // SAFETY: both ranges lie inside their vectors, which do not overlap.
                unsafe { stream_copy(dst.as_mut_ptr().add(d_at), src.as_ptr().add(s_at), len) };
                assert_eq!(
                    &dst[d_at..d_at + len],
                    &src[s_at..s_at + len],
                    "{len} {d_at} {s_at}"
                );
                assert!(
                    dst[..d_at]
                        .iter()
                        .chain(&dst[d_at + len..])
                        .all(|&b| b == 0xAA)
                );
            }
        }
    }

    #[test]
    fn a_pooled_copy_equals_the_source() {
        for threads in [1, 2, 3, 16] {
            let pool = CopyPool::new(threads);
            for lens in [
                vec![],
                vec![0],
                vec![1, 1000],
                vec![(3 << 20) + 7, 5, 1 << 20],
                vec![(17 << 20) + 3, 1 << 18],
            ] {
                let srcs: Vec<Vec<u8>> = lens
                    .iter()
                    .map(|&n| (0..n).map(|i| (i * 7 % 251) as u8).collect())
                    .collect();
                let mut dsts: Vec<Vec<u8>> = lens.iter().map(|&n| vec![0; n]).collect();
                let mut pieces: Vec<_> = dsts
                    .iter_mut()
                    .zip(&srcs)
                    .map(|(d, s)| (d.as_mut_slice(), s.as_slice()))
                    .collect();
                pool.copy(&mut pieces);
                assert_eq!(dsts, srcs, "lengths {lens:?}, {threads} threads");
            }
        }
    }
}
