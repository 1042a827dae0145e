//! A flat hash table of 16-byte keys for [`VocabIndex`](super::categorical::VocabIndex),
//! probed in batches with each batch's slots prefetched.
//!
//! Hand-written because the batched probe is its reason to exist: mapping a Parquet
//! dictionary (tens of thousands of values per row group and column) to vocabulary ids, or
//! interning it while fitting, is one probe per value into a table larger than L2, and
//! each probe waited on its cache miss (1M Criteo rows: ~2.1M probes, 10-11% of a
//! vocabulary job's samples, most of them in the slot load). hashbrown's `HashTable` has no
//! way to name a bucket's address ahead of the probe, so nothing could be prefetched.
//!
//! Open addressing with linear probing over a power-of-two array kept at most half full;
//! each slot keeps 32 bits of its hash, so growing never hashes a value again.

/// A key: a short value's bytes and length, or a long value's prefix (see `key_of`).
pub(crate) type Key = [u64; 2];

/// A table entry: index `id - 1`, or a free slot where `id` is 0.
#[derive(Debug, Clone, Copy)]
struct Slot {
    key: Key,
    hash: u32,
    id: u32,
}

/// `n` free slots. (Written, not `alloc_zeroed`: zeroed tables came as fresh pages to
/// fault in, where a written one reuses freed memory; a vocabulary job's CPU rose ~30%.)
fn free_slots(n: usize) -> Vec<Slot> {
    const FREE: Slot = Slot {
        key: [0; 2],
        hash: 0,
        id: 0,
    };
    vec![FREE; n]
}

/// How many probes a batch hashes and prefetches before the first of them is made: enough
/// misses in flight to cover their latency, few enough that the lines are still cached.
const BATCH: usize = 32;

/// Indices by key; the values themselves live elsewhere (a `Vocabulary`), so a long
/// value's key is only its prefix and the caller settles equality.
#[derive(Debug, Clone, Default)]
pub(crate) struct Table {
    slots: Vec<Slot>,
    len: usize,
}

impl Table {
    /// A table that holds `n` entries without growing.
    pub fn with_capacity(n: usize) -> Self {
        let mut table = Table::default();
        table.reserve(n);
        table
    }

    /// Makes room for `additional` more entries without growing.
    pub fn reserve(&mut self, additional: usize) {
        let want = (self.len + additional)
            .saturating_mul(2)
            .next_power_of_two();
        if want <= self.slots.len() {
            return;
        }
        let old = std::mem::replace(&mut self.slots, free_slots(want.max(16)));
        let mask = self.slots.len() - 1;
        for s in old.into_iter().filter(|s| s.id != 0) {
            let mut i = s.hash as usize & mask;
            while self.slots[i].id != 0 {
                i = (i + 1) & mask;
            }
            self.slots[i] = s;
        }
    }

    /// Takes the next [`BATCH`] of `items` (each with its hash) into `batch`, prefetching
    /// their first slots, so that probing them next finds the lines on their way; false
    /// once `items` is done.
    pub fn stage<T>(
        &self,
        items: &mut impl Iterator<Item = (u64, T)>,
        batch: &mut Vec<(u64, T)>,
    ) -> bool {
        batch.extend(items.take(BATCH).inspect(|&(h, _)| self.prefetch(h)));
        !batch.is_empty()
    }

    /// Brings the cache line of `hash`'s first slot in; a hint, with no effect on results.
    #[inline(always)]
    fn prefetch(&self, hash: u64) {
        if let Some(slot) = self.slots.get(hash as u32 as usize & self.mask()) {
            super::prefetch(slot);
        }
    }

    /// The index stored under `key` with hash `hash`; `same(index)` settles keys that are a
    /// long value's prefix.
    #[inline]
    pub fn find(
        &self,
        hash: u64,
        key: &Key,
        long: bool,
        same: impl Fn(u32) -> bool,
    ) -> Option<u32> {
        if self.slots.is_empty() {
            return None;
        }
        let (mask, h) = (self.mask(), hash as u32);
        let mut i = h as usize & mask;
        loop {
            let s = &self.slots[i];
            if s.id == 0 {
                return None;
            }
            let index = s.id - 1;
            if s.key == *key && (!long || (s.hash == h && same(index))) {
                return Some(index);
            }
            i = (i + 1) & mask;
        }
    }

    /// Stores `index` (below `u32::MAX`) under `key`, known not to be there.
    pub fn insert_new(&mut self, hash: u64, key: Key, index: u32) {
        self.reserve(1);
        let (mask, h) = (self.mask(), hash as u32);
        let mut i = h as usize & mask;
        while self.slots[i].id != 0 {
            i = (i + 1) & mask;
        }
        self.slots[i] = Slot {
            key,
            hash: h,
            id: index + 1,
        };
        self.len += 1;
    }

    fn mask(&self) -> usize {
        self.slots.len().wrapping_sub(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against a map, with hashes chosen to collide and wrap around the end.
    #[test]
    fn finds_what_was_inserted_through_collisions_and_growth() {
        let mut table = Table::default();
        let mut want = std::collections::HashMap::new();
        for i in 0..5000u32 {
            // Few distinct hashes: long probe runs that cross the array's end.
            let hash = (i % 7) as u64 * 0x9E37_79B9 + u32::MAX as u64 - 3;
            let key = [i as u64 / 3, (i % 3) as u64];
            assert_eq!(table.find(hash, &key, false, |_| true), None);
            table.insert_new(hash, key, i);
            want.insert((hash, key), i);
        }
        for ((hash, key), i) in want {
            assert_eq!(table.find(hash, &key, false, |_| true), Some(i));
            // A long key is settled by the caller.
            assert_eq!(table.find(hash, &key, true, |_| false), None);
            assert_eq!(table.find(hash, &key, true, |j| j == i), Some(i));
        }
        assert!(table.slots.len() >= 2 * table.len);
    }
}
