//! Moving fixed-width rows: gathering them from a batch's buffer into a run, and writing a
//! run out with streaming stores. Used to put featurized rows into slots of other buffers
//! (`transform/into.rs`).

/// Rows `rows` of `src` (`n` bytes each), one after another into `out` (of
/// `rows.len() · n` bytes, at most).
pub fn gather(src: &[u8], rows: &[u32], n: usize, out: &mut [u8]) {
    // Rows of the widths featurized columns have are moved as arrays of a known size
    // (a few vector moves): a `memcpy` call a row cost more than the row.
    macro_rules! fixed {
        ($($k:literal)*) => {
            match n {
                $($k => {
                    let from = src.as_chunks::<$k>().0;
                    for (to, &r) in out.as_chunks_mut::<$k>().0.iter_mut().zip(rows) {
                        *to = from[r as usize];
                    }
                })*
                _ => {
                    for (to, &r) in out.chunks_exact_mut(n.max(1)).zip(rows) {
                        to.copy_from_slice(&src[r as usize * n..][..n]);
                    }
                }
            }
        };
    }
    fixed!(4 8 12 16 20 24 28 32 36 40 44 48 52 56 60 64 128 208 256);
}

/// Writes `src` to `dst`, with streaming stores where `dst` allows (x86-64): for memory
/// read again only much later, whose cache lines a plain store would first read in for
/// nothing. Call [`store_fence`] before another thread may read what was written.
///
/// # Safety
/// `src.len()` bytes from `dst` are valid for writes and overlap nothing `src` holds.
pub unsafe fn stream_out(dst: *mut u8, src: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
        let head = dst.align_offset(16).min(src.len());
        let body = (src.len() - head) / 16 * 16;
        // SAFETY: every write below stays inside `dst[..src.len()]` (the caller's
        // promise); the streaming stores are to 16-byte aligned addresses.
        unsafe {
            // The ends (under 16 bytes each) byte by byte: a `memcpy` call of a length
            // not known here cost more than they do.
            for k in (0..head).chain(head + body..src.len()) {
                dst.add(k).write(src[k]);
            }
            for k in (head..head + body).step_by(16) {
                let v = _mm_loadu_si128(src.as_ptr().add(k).cast::<__m128i>());
                _mm_stream_si128(dst.add(k).cast::<__m128i>(), v);
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: the caller's promise.
    unsafe {
        std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len())
    };
}

/// Orders this thread's streaming stores before its later writes (a lock's release), so
/// that a thread that then takes the lock sees them.
pub fn store_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a fence has no preconditions.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gathers_rows_of_any_width_in_the_order_given() {
        for n in [1usize, 4, 8, 52, 68, 208, 300] {
            let src: Vec<u8> = (0..10 * n).map(|i| (i * 7 % 251) as u8).collect();
            let rows = [9u32, 0, 4, 4, 7];
            let mut out = vec![0u8; rows.len() * n];
            gather(&src, &rows, n, &mut out);
            for (k, &r) in rows.iter().enumerate() {
                let r = r as usize;
                assert_eq!(out[k * n..][..n], src[r * n..][..n], "width {n}, row {k}");
            }
        }
    }

    #[test]
    fn streams_out_exactly_its_bytes_at_any_alignment() {
        for offset in 0..17 {
            for len in [0usize, 1, 15, 16, 17, 31, 64, 100, 4096] {
                let mut dst = vec![0xEEu8; len + 40];
                let src: Vec<u8> = (0..len).map(|i| i as u8).collect();
                // SAFETY: `dst` has `offset + len` bytes and more, apart from `src`.
                unsafe { stream_out(dst.as_mut_ptr().add(offset), &src) };
                store_fence();
                assert!(dst[..offset].iter().all(|&b| b == 0xEE), "{offset} {len}");
                assert_eq!(&dst[offset..offset + len], &src[..], "{offset} {len}");
                assert!(
                    dst[offset + len..].iter().all(|&b| b == 0xEE),
                    "{offset} {len}"
                );
            }
        }
    }
}
