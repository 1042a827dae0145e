//! Pure kernels: functions on Arrow buffers, tested against plain reference
//! definitions, with no knowledge of pipelines or dataflows.

pub mod categorical;
pub mod log1p;
pub mod numeric;
pub mod rows;
mod table;

/// Asks the CPU to bring `value`'s cache lines in; a hint, with no effect on results.
#[inline(always)]
pub fn prefetch<T>(value: &T) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        const LINE: usize = 64;
        let start = value as *const T as *const i8;
        let size = size_of::<T>();
        let mut offset = 0;
        while offset < size {
            // SAFETY: a prefetch reads nothing and cannot fault, and the address is inside
            // `value` (`offset < size`).
            unsafe { _mm_prefetch::<_MM_HINT_T0>(start.wrapping_add(offset)) };
            offset += LINE;
        }
        if size > 1 && (start as usize + size - 1) / LINE != (start as usize + offset - LINE) / LINE
        {
            // SAFETY: as above; the value's last byte, on a line the loop did not reach.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(start.wrapping_add(size - 1)) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = value;
}
