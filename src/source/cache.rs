//! Units kept in memory after their first read (`--cache-mib`), so that later epochs,
//! catch-up runs and other ranks' runs take a unit's decoded batches instead of reading
//! and decoding the file again, as a server holding its table in memory does.
//!
//! The cache has a fixed budget: a unit is kept only if all of its batches fit in what is
//! left, and nothing is ever evicted, so what is cached is the first units read that fit
//! and memory stays within the budget whatever the input's size. A cached unit is served
//! as it was first read: a file changed later is not read again.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use hydrant_operators::Batch;

use crate::error::Result;

/// A unit's place in the input: its file and row group.
pub(super) type UnitKey = (usize, usize);

/// Decoded units, up to a budget of bytes.
#[derive(Debug)]
pub(super) struct UnitCache {
    budget: u64,
    used: AtomicU64,
    units: Mutex<HashMap<UnitKey, Arc<[Batch]>>>,
}

impl UnitCache {
    /// An empty cache that keeps at most `budget` bytes of batches.
    pub fn new(budget: u64) -> Self {
        UnitCache {
            budget,
            used: AtomicU64::new(0),
            units: Mutex::default(),
        }
    }

    /// Bytes held.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// The batches of unit `key`, if it is cached.
    pub fn get(&self, key: UnitKey) -> Option<Arc<[Batch]>> {
        self.lock().get(&key).cloned()
    }

    /// `batches` (a unit being read) with the unit kept as it goes by, if it fits.
    pub fn fill(
        self: &Arc<Self>,
        key: UnitKey,
        batches: Box<dyn Iterator<Item = Result<Batch>> + Send>,
    ) -> Box<dyn Iterator<Item = Result<Batch>> + Send> {
        Box::new(Filling {
            cache: self.clone(),
            key,
            batches,
            kept: Some(Vec::new()),
            reserved: 0,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<UnitKey, Arc<[Batch]>>> {
        self.units.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes `bytes` of the budget; false (and nothing taken) if they do not fit.
    fn reserve(&self, bytes: u64) -> bool {
        self.used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                used.checked_add(bytes).filter(|&u| u <= self.budget)
            })
            .is_ok()
    }

    fn release(&self, bytes: u64) {
        self.used.fetch_sub(bytes, Ordering::Relaxed);
    }
}

/// A unit's batches passed through, a copy of each (arrays are shared, not copied) kept
/// until the unit ends whole, then cached.
struct Filling {
    cache: Arc<UnitCache>,
    key: UnitKey,
    batches: Box<dyn Iterator<Item = Result<Batch>> + Send>,
    /// `None` once the unit cannot be cached (over budget, or a read failed).
    kept: Option<Vec<Batch>>,
    reserved: u64,
}

impl Filling {
    fn give_up(&mut self) {
        self.kept = None;
        self.cache.release(std::mem::take(&mut self.reserved));
    }
}

impl Iterator for Filling {
    type Item = Result<Batch>;

    fn next(&mut self) -> Option<Result<Batch>> {
        let next = self.batches.next();
        match &next {
            Some(Ok(b)) if self.kept.is_some() => {
                // The bytes of the arrays' slices: arrays of one read block share it, so their
                // capacities would count the block once per column.
                let bytes = hydrant_flight::batch_bytes(&b.data) as u64;
                if self.cache.reserve(bytes) {
                    self.reserved += bytes;
                    if let Some(kept) = self.kept.as_mut() {
                        kept.push(b.clone());
                    }
                } else {
                    self.give_up();
                }
            }
            Some(Ok(_)) => {}
            Some(Err(_)) => self.give_up(),
            None => {
                if let Some(kept) = self.kept.take() {
                    let reserved = std::mem::take(&mut self.reserved);
                    match self.cache.lock().entry(self.key) {
                        // Another reader of the same unit cached it first.
                        Entry::Occupied(_) => self.cache.release(reserved),
                        Entry::Vacant(v) => {
                            v.insert(kept.into());
                        }
                    }
                }
            }
        }
        next
    }
}

impl Drop for Filling {
    /// A unit abandoned before its end (a run stopped) is not cached.
    fn drop(&mut self) {
        if self.kept.is_some() {
            self.give_up();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int64Array, RecordBatch};

    fn batches(n: usize) -> Vec<Batch> {
        (0..n)
            .map(|i| Batch {
                seq: i as u64,
                data: RecordBatch::try_from_iter([(
                    "x",
                    Arc::new(Int64Array::from_iter_values(0..1000)) as _,
                )])
                .unwrap(),
            })
            .collect()
    }

    fn read(cache: &Arc<UnitCache>, key: UnitKey, unit: Vec<Result<Batch>>) -> usize {
        cache.fill(key, Box::new(unit.into_iter())).count()
    }

    #[test]
    fn a_unit_read_whole_is_kept_within_the_budget() {
        let cache = Arc::new(UnitCache::new(20_000));
        assert_eq!(
            read(&cache, (0, 0), batches(2).into_iter().map(Ok).collect()),
            2
        );
        let kept = cache.get((0, 0)).expect("cached");
        assert_eq!(kept.len(), 2);
        assert_eq!(kept[1].data, batches(2)[1].data);
        assert_eq!(cache.used(), 16_000);
        // A second unit does not fit what is left: not kept, and its bytes are given back.
        assert_eq!(
            read(&cache, (0, 1), batches(1).into_iter().map(Ok).collect()),
            1
        );
        assert!(cache.get((0, 1)).is_none());
        assert_eq!(cache.used(), 16_000);
    }

    #[test]
    fn failed_abandoned_and_twice_read_units_give_their_bytes_back() {
        let cache = Arc::new(UnitCache::new(1 << 20));
        let failing = vec![
            Ok(batches(1).remove(0)),
            Err(crate::Error::Usage("cut".into())),
        ];
        assert_eq!(read(&cache, (1, 0), failing), 2);
        assert!(cache.get((1, 0)).is_none());
        let mut half = cache.fill((2, 0), Box::new(batches(3).into_iter().map(Ok)));
        half.next();
        drop(half);
        assert!(cache.get((2, 0)).is_none());
        assert_eq!(cache.used(), 0);
        read(&cache, (3, 0), batches(1).into_iter().map(Ok).collect());
        read(&cache, (3, 0), batches(1).into_iter().map(Ok).collect());
        assert_eq!(cache.used(), 8_000);
    }
}
