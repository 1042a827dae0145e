//! Shuffled steps' buffers, carved from large chunks that the kernel backs with huge pages
//! and that live apart from the allocator's heaps.
//!
//! A shuffled step is filled over its whole window (see `delivery/fill.rs`): with the
//! default window of 65,536 Criteo rows, two readers keep ~40 MB of steps open. Taken from
//! glibc's per-thread heaps, those buffers pushed a heap past its 64 MiB, and the heap
//! added for the excess was unmapped and mapped again over and over (`strace`: 37
//! `munmap`s of a 64 MiB heap in 3 epochs of 1M rows, 151 in 6), its pages faulted in
//! afresh each time. From chunks of their own, advised as 2 MiB pages, 3 epochs of 1M
//! shuffled rows took 33,200 page faults instead of 62,600, and 10M shuffled rows 3.0 s of
//! CPU instead of 3.1 (`perf stat`, medians of 5). Hand-written because no allocator
//! crate gives a few buffers huge pages without taking over every allocation, and
//! jemalloc and mimalloc as the global allocator peaked higher (bench/analysis.md).
//!
//! A chunk holds blocks of one size (at least [`BLOCKS`] of them, and none under
//! [`MIN_BLOCK`]); a block goes back to its chunk when the last buffer made from it is
//! dropped. The chunks are bounded ([`KEEP_BYTES`] in all; past that a step's buffers come
//! from the allocator as before), and a chunk none of whose blocks is lent is unmapped by
//! [`release_idle`] (the server's periodic sweep).

use std::ptr::NonNull;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use arrow::buffer::Buffer;

/// Blocks a chunk is cut into, at least (as many as fill its huge pages).
const BLOCKS: usize = 16;
/// Smaller blocks are not taken from chunks: the allocator serves them from memory it
/// holds, and a chunk of such blocks would be mostly empty huge pages.
const MIN_BLOCK: usize = 64 << 10;
/// The most the chunks may hold in all, in bytes.
const KEEP_BYTES: usize = 256 << 20;
/// A huge page on x86_64 (and aarch64 with 4 KiB pages); chunks are a multiple of it and
/// aligned to it.
const HUGE: usize = 2 << 20;

/// The chunks the fills take their blocks from.
static CHUNKS: Chunks = Chunks::new(KEEP_BYTES);

/// A block of at least `len` bytes, 64-byte aligned (its bytes are what its last user
/// left); `None` for less than [`MIN_BLOCK`], when the chunks are at their bound, or when
/// the system refused a new one.
pub(crate) fn take(len: usize) -> Option<Block> {
    CHUNKS.take(len)
}

/// Unmaps the chunks none of whose blocks has been lent for `idle`; returns how many bytes.
pub(crate) fn release_idle(idle: Duration) -> usize {
    CHUNKS.release_idle(idle)
}

/// Chunks of every block size, at most `keep` bytes of them.
struct Chunks {
    all: Mutex<Vec<Arc<Chunk>>>,
    keep: usize,
}

impl Chunks {
    const fn new(keep: usize) -> Self {
        Chunks {
            all: Mutex::new(Vec::new()),
            keep,
        }
    }

    fn all(&self) -> std::sync::MutexGuard<'_, Vec<Arc<Chunk>>> {
        self.all.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn take(&self, len: usize) -> Option<Block> {
        if len < MIN_BLOCK {
            return None;
        }
        let size = len.next_multiple_of(64);
        let mut all = self.all();
        for chunk in all.iter().filter(|c| c.block == size) {
            if let Some(index) = chunk.lend() {
                let chunk = chunk.clone();
                return Some(Block { chunk, index });
            }
        }
        let held: usize = all.iter().map(|c| c.len).sum();
        let len = size.checked_mul(BLOCKS)?.checked_next_multiple_of(HUGE)?;
        let blocks = len / size;
        if held.saturating_add(len) > self.keep {
            return None;
        }
        let chunk = Arc::new(Chunk::map(len, size, blocks)?);
        let index = chunk.lend()?;
        all.push(chunk.clone());
        Some(Block { chunk, index })
    }

    fn release_idle(&self, idle: Duration) -> usize {
        let mut all = self.all();
        let before: usize = all.iter().map(|c| c.len).sum();
        all.retain(|c| !c.idle_for(idle));
        before - all.iter().map(|c| c.len).sum::<usize>()
    }

    #[cfg(test)]
    fn held(&self) -> usize {
        self.all().iter().map(|c| c.len).sum()
    }
}

/// One block of a chunk, lent until dropped.
pub(crate) struct Block {
    chunk: Arc<Chunk>,
    index: usize,
}

impl Block {
    /// The block's first byte; it has room for the `len` asked of [`take`].
    pub(crate) fn as_mut_ptr(&mut self) -> *mut u8 {
        // SAFETY: `index < blocks` and `blocks · block ≤ len`: the offset stays inside the
        // chunk's mapping.
        unsafe { self.chunk.base.as_ptr().add(self.index * self.chunk.block) }
    }

    /// Bytes `offset..offset + len` of the block as a buffer that keeps the block lent.
    ///
    /// # Safety
    /// The range lies inside the block, and its bytes were written before (nothing writes
    /// them once shared).
    pub(crate) unsafe fn share(self: &Arc<Self>, offset: usize, len: usize) -> Buffer {
        debug_assert!(offset + len <= self.chunk.block);
        let start = self.index * self.chunk.block + offset;
        // SAFETY: the caller keeps the range inside the block, inside the mapping; the
        // `Arc` owner keeps the block (and its chunk) alive as long as the buffer.
        unsafe {
            let ptr = NonNull::new_unchecked(self.chunk.base.as_ptr().add(start));
            Buffer::from_custom_allocation(ptr, len, self.clone())
        }
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        self.chunk.give_back(self.index);
    }
}

/// A mapping cut into blocks of one size.
struct Chunk {
    base: NonNull<u8>,
    len: usize,
    block: usize,
    blocks: usize,
    /// Blocks not lent, and when a block last came back.
    free: Mutex<(Vec<usize>, Instant)>,
}

// SAFETY: the chunk's memory is reached only through its blocks, each lent to one owner
// at a time (the free list is behind a lock); `base` itself never changes.
unsafe impl Send for Chunk {}
// SAFETY: as above.
unsafe impl Sync for Chunk {}

impl Chunk {
    /// Maps `len` bytes (a multiple of [`HUGE`], at least `blocks · block`).
    fn map(len: usize, block: usize, blocks: usize) -> Option<Chunk> {
        let base = map_huge(len)?;
        Some(Chunk {
            base,
            len,
            block,
            blocks,
            free: Mutex::new(((0..blocks).rev().collect(), Instant::now())),
        })
    }

    fn free(&self) -> std::sync::MutexGuard<'_, (Vec<usize>, Instant)> {
        self.free.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn lend(&self) -> Option<usize> {
        self.free().0.pop()
    }

    fn give_back(&self, index: usize) {
        let mut free = self.free();
        free.0.push(index);
        free.1 = Instant::now();
    }

    fn idle_for(&self, idle: Duration) -> bool {
        let free = self.free();
        free.0.len() == self.blocks && free.1.elapsed() >= idle
    }
}

impl Drop for Chunk {
    fn drop(&mut self) {
        unmap(self.base, self.len);
    }
}

/// `len` zeroed bytes aligned to [`HUGE`], advised as huge pages on Linux.
#[cfg(unix)]
fn map_huge(len: usize) -> Option<NonNull<u8>> {
    // One huge page longer, then trimmed to an aligned start: `mmap` only promises the
    // base page's alignment.
    let span = len.checked_add(HUGE)?;
    // SAFETY: an anonymous private mapping of fresh memory; no existing memory is touched.
    let raw = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            span,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if raw == libc::MAP_FAILED {
        return None;
    }
    let start = raw as usize;
    let aligned = start.next_multiple_of(HUGE);
    let end = start + span;
    // SAFETY: both trimmed ranges lie inside the mapping just made, which nothing uses yet;
    // `madvise` only advises on the part kept.
    unsafe {
        if aligned > start {
            libc::munmap(raw, aligned - start);
        }
        if end > aligned + len {
            libc::munmap((aligned + len) as *mut libc::c_void, end - aligned - len);
        }
        #[cfg(target_os = "linux")]
        libc::madvise(aligned as *mut libc::c_void, len, libc::MADV_HUGEPAGE);
    }
    NonNull::new(aligned as *mut u8)
}

#[cfg(unix)]
fn unmap(base: NonNull<u8>, len: usize) {
    // SAFETY: `base..base + len` is a mapping made by `map_huge`, and the chunk that owned
    // it is being dropped: no block of it is lent (each holds the chunk).
    unsafe { libc::munmap(base.as_ptr().cast(), len) };
}

#[cfg(not(unix))]
fn map_huge(len: usize) -> Option<NonNull<u8>> {
    let layout = std::alloc::Layout::from_size_align(len, HUGE).ok()?;
    // SAFETY: `layout` has a non-zero size.
    NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) })
}

#[cfg(not(unix))]
fn unmap(base: NonNull<u8>, len: usize) {
    if let Ok(layout) = std::alloc::Layout::from_size_align(len, HUGE) {
        // SAFETY: allocated by `map_huge` with this layout, and no block of it is lent.
        unsafe { std::alloc::dealloc(base.as_ptr(), layout) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Blocks are aligned, disjoint and lent once; a buffer shared from a block keeps it
    /// lent and keeps its bytes; the bound holds; idle chunks are unmapped, lent ones not.
    #[test]
    fn blocks_are_lent_once_shared_safely_bounded_and_released() {
        let len: usize = 100_000;
        let chunk_len = (len.next_multiple_of(64) * BLOCKS).next_multiple_of(HUGE);
        let per_chunk = chunk_len / len.next_multiple_of(64);
        let chunks = Chunks::new(chunk_len);
        assert!(chunks.take(MIN_BLOCK - 1).is_none());
        let mut blocks: Vec<Block> = (0..per_chunk).map(|_| chunks.take(len).unwrap()).collect();
        let mut starts: Vec<usize> = blocks.iter_mut().map(|b| b.as_mut_ptr() as usize).collect();
        assert!(starts.iter().all(|s| s % 64 == 0));
        starts.sort_unstable();
        assert!(starts.windows(2).all(|w| w[1] - w[0] >= len));
        // One chunk is all the bound allows.
        assert!(chunks.take(len).is_none());
        assert_eq!(chunks.held() % HUGE, 0);

        let mut block = blocks.pop().unwrap();
        let ptr = block.as_mut_ptr();
        // SAFETY: the block has room for `len` bytes, and only this test holds it.
        unsafe { std::ptr::write_bytes(ptr, 7, len) };
        let block = Arc::new(block);
        // SAFETY: bytes 10..110 lie inside the block and were written above.
        let shared = unsafe { block.share(10, 100) };
        drop(block);
        // The buffer still holds the block: no new block is to be had, and no idle chunk.
        assert!(chunks.take(len).is_none());
        assert_eq!(chunks.release_idle(Duration::ZERO), 0);
        assert_eq!(shared.as_slice(), &[7u8; 100][..]);
        drop(shared);
        let again = chunks.take(len).unwrap();
        drop(again);
        // Lent blocks keep their chunk mapped.
        assert_eq!(chunks.release_idle(Duration::ZERO), 0);
        drop(blocks);
        assert_eq!(chunks.release_idle(Duration::from_secs(60)), 0);
        let held = chunks.held();
        assert_eq!(held, chunk_len);
        assert_eq!(chunks.release_idle(Duration::ZERO), held);
        assert_eq!(chunks.held(), 0);
        assert!(chunks.take(len).is_some());
    }
}
