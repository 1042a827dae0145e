//! Large buffers (read buffers, the columns of gathered steps) that return to a small
//! shared pool when the last array using one is dropped.
//!
//! A served Arrow file is read again every epoch, a block (one record batch, often a step
//! of several MiB) at a time. A fresh allocation of that size is a fresh mapping: the
//! kernel faults in and zeroes every page before `pread` overwrites it, and takes the pages
//! back when the batch is freed, only to do it again for the next block. With four ranks
//! served over loopback that was a third of the server's kernel time. Reused buffers keep
//! their pages. Hand-written because the allocator cannot know that these buffers come
//! back at the same sizes. A shuffled step's gathered columns (about 1 MiB a step for a
//! Criteo row) are the same case: fresh, their page faults were a fifth of what shuffling
//! added to a run. The pool is bounded (by bytes, so memory stays flat however
//! long the file), and what sits unused in it is let go by [`release_idle`], which the
//! server's periodic sweep calls.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use arrow::buffer::{Buffer, MutableBuffer};

/// The most the pool keeps, in bytes of capacity. A served rank's replay buffer keeps
/// its recent steps, each a slice of the block it was read in, so a block of four ranks'
/// steps comes back only once all four replay buffers have let go of it: with 17 MB
/// blocks and four ranks, 64 MiB still missed on most reads.
const KEEP_BYTES: usize = 256 << 20;
/// Smaller buffers are not kept: `malloc` serves them from memory it already holds.
const MIN_BYTES: usize = 256 << 10;

/// The pool the inputs read into and steps are gathered into.
static POOL: Pool = Pool::new();

/// An empty buffer with room for at least `len` bytes (see [`Pool::take`]).
pub(crate) fn take(len: usize) -> MutableBuffer {
    POOL.take(len)
}

/// `buffer` as a [`Buffer`] that returns to the pool (see [`Pool::freeze`]).
pub(crate) fn freeze(buffer: MutableBuffer) -> Buffer {
    POOL.freeze(buffer)
}

/// Frees the pooled buffers no read has taken for `idle`; returns how many bytes.
pub fn release_idle(idle: Duration) -> usize {
    POOL.release_idle(idle)
}

/// Hands memory freed in glibc's heaps back to the system. glibc keeps the free pages of
/// every thread's arena for that thread's later use (up to the trim threshold the CLI
/// raises), and some memory is freed by a thread that will not allocate as much again:
/// - a forgotten served run's dataflow threads: without this, a server that ran 50 small
///   epochs held 74 MB where it held 31 MB after two, with nothing leaked;
/// - the thread that opened the inputs, which decoded whole Parquet footers: 2.9 MB of
///   10M Criteo rows' footer stayed in the main thread's heap for the whole run.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub(crate) fn release_freed_memory() {
    // SAFETY: `malloc_trim` only walks glibc's own free lists under its arena locks; it
    // may be called from any thread at any time and touches no memory in use.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Elsewhere the allocator's own policy stands.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub(crate) fn release_freed_memory() {}

/// Free buffers, each with the time it came back.
struct Pool {
    free: Mutex<Vec<(Instant, MutableBuffer)>>,
}

impl Pool {
    const fn new() -> Self {
        Pool {
            free: Mutex::new(Vec::new()),
        }
    }

    fn free(&self) -> std::sync::MutexGuard<'_, Vec<(Instant, MutableBuffer)>> {
        self.free.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// An empty buffer with room for at least `len` bytes: a pooled one no more than
    /// twice that size if there is one, else a new one.
    fn take(&self, len: usize) -> MutableBuffer {
        if len >= MIN_BYTES {
            let mut free = self.free();
            let fits = free
                .iter()
                .enumerate()
                .filter(|(_, (_, b))| (len..=2 * len).contains(&b.capacity()))
                .min_by_key(|(_, (_, b))| b.capacity())
                .map(|(i, _)| i);
            if let Some(i) = fits {
                let (_, mut buffer) = free.swap_remove(i);
                buffer.clear();
                return buffer;
            }
        }
        MutableBuffer::with_capacity(len)
    }

    /// `buffer` as an immutable [`Buffer`] that goes back to the pool when its last user
    /// drops it (if the pool has room for it then).
    fn freeze(&'static self, buffer: MutableBuffer) -> Buffer {
        if buffer.capacity() < MIN_BYTES {
            return buffer.into();
        }
        Buffer::from(bytes::Bytes::from_owner(Pooled { buffer, pool: self }))
    }

    fn give_back(&self, buffer: MutableBuffer) {
        let mut free = self.free();
        if held(&free) + buffer.capacity() <= KEEP_BYTES {
            free.push((Instant::now(), buffer));
        }
    }

    fn release_idle(&self, idle: Duration) -> usize {
        let mut free = self.free();
        let before = held(&free);
        free.retain(|(at, _)| at.elapsed() < idle);
        before - held(&free)
    }
}

fn held(free: &[(Instant, MutableBuffer)]) -> usize {
    free.iter().map(|(_, b)| b.capacity()).sum()
}

/// A buffer on loan from a pool.
struct Pooled {
    buffer: MutableBuffer,
    pool: &'static Pool,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        self.buffer.as_slice()
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        self.pool.give_back(std::mem::take(&mut self.buffer));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dropped_buffer_is_reused_for_reads_of_about_its_size_until_it_idles() {
        let pool: &'static Pool = Box::leak(Box::new(Pool::new()));
        let len = 1 << 20;
        let mut b = pool.take(len);
        b.extend_from_slice(&vec![7u8; len]);
        let ptr = b.as_ptr();
        let frozen = pool.freeze(b);
        let slice = frozen.slice_with_length(10, 100);
        drop(frozen);
        // Still lent while a slice of it lives, and it still holds its bytes.
        assert_eq!(held(&pool.free()), 0);
        assert_eq!(slice.as_slice(), &[7u8; 100][..]);
        drop(slice);
        assert_eq!(held(&pool.free()), len.next_multiple_of(64));
        // A read of less than half its size gets a buffer of its own.
        assert!(pool.take(len / 3).capacity() < len);
        let again = pool.take(len - 5);
        assert_eq!(again.as_ptr(), ptr);
        assert!(again.is_empty());
        // Small buffers are not pooled; the pool keeps at most KEEP_BYTES.
        drop(pool.freeze(pool.take(1000)));
        assert_eq!(held(&pool.free()), 0);
        let big: Vec<_> = (0..5)
            .map(|_| pool.freeze(pool.take(KEEP_BYTES / 4)))
            .collect();
        drop(big);
        assert_eq!(held(&pool.free()), KEEP_BYTES);
        // Idle buffers are let go.
        drop(pool.freeze(again));
        assert_eq!(pool.release_idle(Duration::from_secs(60)), 0);
        assert_eq!(pool.release_idle(Duration::ZERO), KEEP_BYTES);
        assert_eq!(held(&pool.free()), 0);
    }
}
