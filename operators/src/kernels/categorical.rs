//! String columns to integer indices: a fitted vocabulary or a hash bucket.
//!
//! Dictionary-encoded columns (what hydrant asks the Parquet reader for) are mapped once per
//! distinct value and then gathered by key; a [`DictCache`] remembers the last dictionary,
//! because a Parquet reader hands the same dictionary to every batch of a row group.

use arrow::array::{Array, ArrayRef, AsArray, Int32Array, Int64Array};
use arrow::datatypes::DataType;

use super::table::{Key, Table};
use crate::error::{OpError, Result};
use crate::vocabulary::Vocabulary;

/// A deterministic fast hasher: hashing here is for lookups, not for anything an
/// adversary can aim at, and the output must not depend on the process.
type FastHash = foldhash::fast::FixedState;

/// A fitted vocabulary ready for lookups.
///
/// The table holds indices into the [`Vocabulary`]'s one buffer: no allocation per value
/// and no copy of the buffer, so binding a state of hundreds of thousands of values is
/// one pass of hashing. A short value (most categorical values: Criteo's are 8 hex digits)
/// is also kept in its entry, so that a lookup compares against the entry it probes
/// instead of reading the value's bounds and bytes from the buffer (two more places in
/// memory per lookup; the featurize pass of 1M Criteo rows went from 0.33 to 0.32 s with
/// it). A dictionary's values are looked up or interned in batches ([`Self::find_all`],
/// [`Self::intern_all`]), each batch's slots prefetched before it is probed.
#[derive(Debug, Clone, Default)]
pub struct VocabIndex {
    values: Vocabulary,
    table: Table,
}

/// A value of at most 15 bytes, zero-padded, with its length in the last byte; or a
/// longer value's first 15 bytes, with [`LONG`] in the last byte. As two little-endian
/// words: bytes 0..8, then bytes 8..16.
/// The last byte of a [`Key`] whose value is longer than it holds.
const LONG: u8 = u8::MAX;

/// The key of `bytes`, built from overlapping word loads: copying a value into a
/// zeroed buffer and reading it back as words stalled every lookup on store forwarding.
#[inline]
fn key_of(bytes: &[u8]) -> Key {
    let n = bytes.len();
    let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap_or_default());
    let half = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap_or_default());
    let (lo, hi, last) = match n {
        16.. => (word(0), word(7) >> 8, LONG),
        9..=15 => (word(0), word(n - 8) >> (8 * (16 - n)), n as u8),
        8 => (word(0), 0, 8),
        4..=7 => {
            let lo = half(0) as u64 | (half(n - 4) as u64) << (8 * (n - 4));
            (lo, 0, n as u8)
        }
        _ => {
            let lo = bytes.iter().rev().fold(0u64, |k, &b| k << 8 | b as u64);
            (lo, 0, n as u8)
        }
    };
    [lo, hi | (last as u64) << 56]
}

/// A key's 16 bytes.
#[cfg(test)]
fn key_bytes(key: &Key) -> [u8; 16] {
    let mut out = [0u8; 16];
    out[..8].copy_from_slice(&key[0].to_le_bytes());
    out[8..].copy_from_slice(&key[1].to_le_bytes());
    out
}

/// The last byte of a key: a short value's length, or [`LONG`].
#[inline]
fn key_len(key: &Key) -> u8 {
    (key[1] >> 56) as u8
}

impl VocabIndex {
    /// Indexes `values`, where position is the index (of a repeated value, the first).
    pub fn new(values: &Vocabulary) -> Self {
        let mut index = VocabIndex {
            values: values.clone(), // shares the buffer
            table: Table::with_capacity(values.len()),
        };
        let mut items = (0..values.len()).map(|i| {
            let bytes = value_bytes(values, i as u32);
            (hash(bytes), (i, bytes))
        });
        let mut batch = Vec::new();
        while index.table.stage(&mut items, &mut batch) {
            for (h, (i, bytes)) in batch.drain(..) {
                if index.find(h, bytes).is_none() {
                    index.insert(h, bytes, i);
                }
            }
        }
        index
    }

    /// The index of `value`, appended (with the next index) if it is not there yet.
    pub fn intern(&mut self, value: &str) -> usize {
        self.intern_hashed(hash(value.as_bytes()), value)
    }

    /// Interns the value of every item, calling `f` with its index and the rest of the
    /// item, in order: what [`Self::intern`] does for each, with a batch of values hashed
    /// and their slots prefetched ahead of their probes.
    pub fn intern_all<'a, T>(
        &mut self,
        items: impl IntoIterator<Item = (&'a str, T)>,
        mut f: impl FnMut(usize, T),
    ) {
        let mut items = items
            .into_iter()
            .map(|(v, item)| (hash(v.as_bytes()), (v, item)));
        let mut batch = Vec::new();
        while self.table.stage(&mut items, &mut batch) {
            for (h, (value, item)) in batch.drain(..) {
                f(self.intern_hashed(h, value), item);
            }
        }
    }

    /// Sets `out[i]` to the index of the `i`-th value (`missing` where it is not in the
    /// vocabulary), leaving null values' slots as they are: a batch of values is hashed and
    /// their slots prefetched ahead of their probes.
    pub fn find_all<'a>(
        &self,
        values: impl IntoIterator<Item = Option<&'a str>>,
        missing: i64,
        out: &mut [i64],
    ) {
        let mut items = (values.into_iter().enumerate())
            .filter_map(|(i, v)| v.map(|v| (hash(v.as_bytes()), (i, v.as_bytes()))));
        let mut batch = Vec::new();
        while self.table.stage(&mut items, &mut batch) {
            for (h, (i, bytes)) in batch.drain(..) {
                if let Some(o) = out.get_mut(i) {
                    *o = self.find(h, bytes).unwrap_or(missing);
                }
            }
        }
    }

    fn intern_hashed(&mut self, h: u64, value: &str) -> usize {
        let bytes = value.as_bytes();
        if let Some(i) = self.find(h, bytes) {
            return i as usize;
        }
        let i = self.values.len();
        self.values.push(value);
        self.insert(h, bytes, i);
        i
    }

    /// The values, in index order.
    pub fn values(&self) -> &Vocabulary {
        &self.values
    }

    /// The number of values: also the index of unseen and null values.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Whether the vocabulary is empty.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    #[inline]
    fn find(&self, hash: u64, bytes: &[u8]) -> Option<i64> {
        let key = key_of(bytes);
        self.table
            .find(hash, &key, key_len(&key) == LONG, |i| {
                value_bytes(&self.values, i) == bytes
            })
            .map(i64::from)
    }

    /// Adds value `index` (whose bytes are `bytes`), known not to be in the table.
    fn insert(&mut self, hash: u64, bytes: &[u8], index: usize) {
        // More than 2^32 - 1 values would take hundreds of GiB before they got here.
        let index = u32::try_from(index)
            .ok()
            .filter(|&i| i < u32::MAX)
            .expect("a vocabulary of fewer than 2^32 - 1 values");
        self.table.insert_new(hash, key_of(bytes), index);
    }
}

#[inline]
fn value_bytes(values: &Vocabulary, i: u32) -> &[u8] {
    values.get(i as usize).unwrap_or_default().as_bytes()
}

#[inline]
fn hash(bytes: &[u8]) -> u64 {
    use std::hash::BuildHasher;
    FastHash::default().hash_one(bytes)
}

/// How a string becomes an index.
#[derive(Debug, Clone)]
pub enum Lookup {
    /// Position in a fitted vocabulary, and the index of values not in it.
    Vocab(VocabIndex, i64),
    /// `xxhash64(bytes, seed 0) mod n`.
    Hash(u64),
}

impl Lookup {
    #[inline]
    fn index(&self, bytes: &[u8]) -> i64 {
        match self {
            Lookup::Vocab(v, unknown) => v.find(hash(bytes), bytes).unwrap_or(*unknown),
            Lookup::Hash(n) => (xxhash_rust::xxh64::xxh64(bytes, 0) % n) as i64,
        }
    }

    /// The index given to null (and, for a vocabulary, unseen) values.
    pub fn missing(&self) -> i64 {
        match self {
            Lookup::Vocab(_, unknown) => *unknown,
            Lookup::Hash(n) => *n as i64,
        }
    }
}

/// The last few dictionaries mapped, most recent first, each kept alive so that its
/// identity cannot be reused. A reader merging the reads of several ranks' shares
/// alternates between their units batch by batch: with one entry, every batch mapped its
/// unit's dictionary again (xxh64 went from 1% to 8% of a run reading two shares).
#[derive(Debug, Default, Clone)]
pub struct DictCache {
    recent: Vec<(ArrayRef, Vec<i64>)>,
}

/// Dictionaries a [`DictCache`] keeps: the units a reader merging two shares has open (each
/// entry holds a mapping per dictionary value; four cost ~4 MB more on Criteo for no gain).
const DICTS: usize = 2;

impl DictCache {
    /// The mapping of dictionary `values`, made by `map` unless it is one of the recent.
    fn mapping(
        &mut self,
        values: &ArrayRef,
        map: impl FnOnce() -> Result<Vec<i64>>,
    ) -> Result<&[i64]> {
        match self.recent.iter().position(|(v, _)| same_array(v, values)) {
            Some(k) => self.recent[..=k].rotate_right(1),
            None => {
                let mapped = map()?;
                self.recent.truncate(DICTS - 1);
                self.recent.insert(0, (values.clone(), mapped));
            }
        }
        Ok(&self.recent[0].1)
    }
}

/// Whether a column type holds strings this module reads.
pub fn is_string_type(t: &DataType) -> bool {
    match t {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => true,
        DataType::Dictionary(k, v) => {
            k.is_dictionary_key_type()
                && is_string_type(v)
                && !matches!(**v, DataType::Dictionary(..))
        }
        _ => false,
    }
}

/// Calls `f` with every slot of a plain string array, `None` for nulls.
pub fn for_each_str(array: &dyn Array, f: impl FnMut(Option<&str>)) -> Result<()> {
    strs(array)?.for_each(f);
    Ok(())
}

/// The slots of a plain string array, `None` for nulls.
pub fn strs(array: &dyn Array) -> Result<Strs<'_>> {
    Ok(match array.data_type() {
        DataType::Utf8 => Strs::Utf8(array.as_string::<i32>().iter()),
        DataType::LargeUtf8 => Strs::Large(array.as_string::<i64>().iter()),
        DataType::Utf8View => Strs::View(array.as_string_view().iter()),
        other => {
            return Err(OpError::Schema(format!(
                "expected a string column, found {other}"
            )));
        }
    })
}

/// An iterator over a string array of any layout (see [`strs`]).
pub enum Strs<'a> {
    /// `Utf8`.
    Utf8(StringArrayIter<'a, i32>),
    /// `LargeUtf8`.
    Large(StringArrayIter<'a, i64>),
    /// `Utf8View`.
    View(arrow::array::ArrayIter<&'a arrow::array::StringViewArray>),
}

/// A `GenericStringArray`'s iterator.
type StringArrayIter<'a, O> = arrow::array::ArrayIter<&'a arrow::array::GenericStringArray<O>>;

impl<'a> Iterator for Strs<'a> {
    type Item = Option<&'a str>;

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        match self {
            Strs::Utf8(i) => i.next(),
            Strs::Large(i) => i.next(),
            Strs::View(i) => i.next(),
        }
    }

    /// Each layout's own loop (`for_each` folds), not a match per slot.
    fn fold<B, F: FnMut(B, Self::Item) -> B>(self, init: B, f: F) -> B {
        match self {
            Strs::Utf8(i) => i.fold(init, f),
            Strs::Large(i) => i.fold(init, f),
            Strs::View(i) => i.fold(init, f),
        }
    }
}

/// Maps every slot of a string (or dictionary-of-string) column to its index.
pub fn strings_to_index(
    array: &dyn Array,
    lookup: &Lookup,
    cache: &mut DictCache,
    out: &mut [i64],
) -> Result<()> {
    assert_eq!(array.len(), out.len(), "output length");
    let missing = lookup.missing();
    if let Some(dict) = array.as_any_dictionary_opt() {
        let values = dict.values();
        let mapped = cache.mapping(values, || {
            let mut mapped = vec![missing; values.len()];
            match lookup {
                Lookup::Vocab(v, _) => v.find_all(strs(values.as_ref())?, missing, &mut mapped),
                Lookup::Hash(_) => {
                    let mut i = 0;
                    for_each_str(values.as_ref(), |v| {
                        if let Some(v) = v {
                            mapped[i] = lookup.index(v.as_bytes());
                        }
                        i += 1;
                    })?
                }
            }
            Ok(mapped)
        })?;
        let keys = dict.keys();
        if let Some(keys) = keys.as_any().downcast_ref::<Int32Array>() {
            gather(keys.values(), mapped, missing, out);
        } else {
            let keys = keys_as_i64(keys)?;
            for (o, &k) in out.iter_mut().zip(keys.values()) {
                *o = usize::try_from(k)
                    .ok()
                    .and_then(|k| mapped.get(k))
                    .copied()
                    .unwrap_or(missing);
            }
        }
        if let Some(nulls) = keys.logical_nulls().filter(|n| n.null_count() > 0) {
            out.iter_mut()
                .zip(nulls.iter())
                .for_each(|(o, valid)| *o = if valid { *o } else { missing });
        }
        return Ok(());
    }
    let mut i = 0;
    for_each_str(array, |v| {
        out[i] = v.map_or(missing, |v| lookup.index(v.as_bytes()));
        i += 1;
    })
}

/// Dictionary keys of any integer type as int64 (arrow's `normalized_keys` panics on an
/// empty dictionary, which a peer can send).
pub(crate) fn keys_as_i64(keys: &dyn Array) -> Result<Int64Array> {
    let keys = arrow::compute::cast(&arrow::array::make_array(keys.to_data()), &DataType::Int64)?;
    Ok(keys.as_primitive::<arrow::datatypes::Int64Type>().clone())
}

#[inline]
fn gather(keys: &[i32], mapped: &[i64], missing: i64, out: &mut [i64]) {
    // Keys under null slots may hold anything, so every key is bounds-checked.
    for (o, &k) in out.iter_mut().zip(keys) {
        *o = mapped.get(k as usize).copied().unwrap_or(missing);
    }
}

/// Whether two arrays are the very same data (same buffers, offset and length).
pub(crate) fn same_array(a: &ArrayRef, b: &ArrayRef) -> bool {
    let (a, b) = (a.to_data(), b.to_data());
    a.len() == b.len()
        && a.offset() == b.offset()
        && a.buffers().len() == b.buffers().len()
        && a.buffers()
            .iter()
            .zip(b.buffers())
            .all(|(x, y)| x.as_ptr() == y.as_ptr())
}

/// Sets `out[r * width + index[r]] = 1.0` for each row whose index is in `[0, width)`; the
/// rest of each row's `width` slots are left as they are (zero).
pub fn one_hot(index: &[i64], width: usize, stride: usize, offset: usize, out: &mut [f32]) {
    for (r, &i) in index.iter().enumerate() {
        if (0..width as i64).contains(&i) {
            out[r * stride + offset + i as usize] = 1.0;
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_key_holds_a_short_value_and_its_length_and_a_long_value_s_prefix() {
        let data: Vec<u8> = (0..40u8).map(|i| i.wrapping_mul(37) | (i & 1)).collect();
        for n in 0..=40 {
            for bytes in [&data[..n], &vec![0u8; n][..]] {
                let mut want = [0u8; 16];
                want[..n.min(15)].copy_from_slice(&bytes[..n.min(15)]);
                want[15] = if n <= 15 { n as u8 } else { LONG };
                assert_eq!(key_bytes(&key_of(bytes)), want, "length {n}");
            }
        }
        let mut index = VocabIndex::default();
        let values = [
            "",
            "\0",
            "a",
            "a\0",
            "0123456789abcdef",
            "0123456789abcdeX",
            "0123456789abcdefg",
        ];
        for v in values {
            index.intern(v);
        }
        for (i, v) in values.iter().enumerate() {
            assert_eq!(index.intern(v), i, "{v:?}");
        }
        assert_eq!(index.len(), values.len());
    }

    use super::*;
    use crate::reference;
    use arrow::array::{DictionaryArray, Int8Array, StringArray, StringViewArray};
    use arrow::datatypes::Int32Type;
    use std::sync::Arc;

    fn words(n: usize, seed: u64) -> Vec<Option<String>> {
        use rand::{RngExt, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        (0..n)
            .map(|_| {
                if rng.random_bool(0.1) {
                    None
                } else {
                    Some(format!("w{}", rng.random_range(0..40u32)))
                }
            })
            .collect()
    }

    #[test]
    fn every_string_layout_matches_reference() {
        for &n in &[0usize, 1, 2, 1000] {
            let data = words(n, n as u64);
            let refs: Vec<Option<&str>> = data.iter().map(|s| s.as_deref()).collect();
            let vocab = reference::vocab(&refs, Some(20), 1);
            let lookups = [
                Lookup::Vocab(VocabIndex::new(&vocab.iter().collect()), vocab.len() as i64),
                Lookup::Hash(17),
            ];
            let plain: ArrayRef = Arc::new(StringArray::from(refs.clone()));
            let view: ArrayRef = Arc::new(StringViewArray::from(refs.clone()));
            let dict: ArrayRef =
                Arc::new(refs.iter().copied().collect::<DictionaryArray<Int32Type>>());
            let dict8: ArrayRef = Arc::new(
                refs.iter()
                    .map(|s| s.map(|s| &s[..2]))
                    .collect::<DictionaryArray<arrow::datatypes::Int8Type>>(),
            );
            for lookup in &lookups {
                let want: Vec<i64> = refs
                    .iter()
                    .map(|v| match lookup {
                        Lookup::Vocab(..) => reference::vocab_index(*v, &vocab),
                        Lookup::Hash(n) => reference::hash_bucket(*v, *n),
                    })
                    .collect();
                for array in [&plain, &view, &dict] {
                    let mut out = vec![-7; n];
                    let mut cache = DictCache::default();
                    strings_to_index(array.as_ref(), lookup, &mut cache, &mut out).unwrap();
                    assert_eq!(out, want, "{:?}", array.data_type());
                    // A second batch with the same dictionary reuses the mapping.
                    strings_to_index(array.as_ref(), lookup, &mut cache, &mut out).unwrap();
                    assert_eq!(out, want);
                }
                let mut out = vec![0; n];
                strings_to_index(dict8.as_ref(), lookup, &mut DictCache::default(), &mut out)
                    .unwrap();
                let want8: Vec<i64> = refs
                    .iter()
                    .map(|v| match lookup {
                        Lookup::Vocab(..) => reference::vocab_index(v.map(|s| &s[..2]), &vocab),
                        Lookup::Hash(n) => reference::hash_bucket(v.map(|s| &s[..2]), *n),
                    })
                    .collect();
                assert_eq!(out, want8);
            }
        }
    }

    /// Null values (a run longer than a batch of probes included) are skipped, and the
    /// values after them still found.
    #[test]
    fn values_after_a_long_run_of_nulls_are_found() {
        let lookup = Lookup::Vocab(VocabIndex::new(&["a", "b"].into_iter().collect()), 2);
        for nulls in [0, 1, 31, 32, 33, 64, 100] {
            let mut values: Vec<Option<&str>> = vec![Some("b")];
            values.extend(std::iter::repeat_n(None, nulls));
            values.extend([Some("a"), Some("x")]);
            let n = values.len() as i32;
            let keys = Int32Array::from(vec![0, n - 2, n - 1, 1.min(n - 1)]);
            let dict = DictionaryArray::new(keys, Arc::new(StringArray::from(values)));
            let mut out = vec![0; 4];
            strings_to_index(&dict, &lookup, &mut DictCache::default(), &mut out).unwrap();
            let null_slot = if nulls > 0 { 2 } else { 0 };
            assert_eq!(out, [1, 0, 2, null_slot], "{nulls} nulls");
        }
    }

    #[test]
    fn a_new_dictionary_is_mapped_again() {
        let lookup = Lookup::Vocab(VocabIndex::new(&["a", "b"].into_iter().collect()), 2);
        let mut cache = DictCache::default();
        let mut out = vec![0; 2];
        let d1: DictionaryArray<Int32Type> = vec!["a", "b"].into_iter().collect();
        strings_to_index(&d1, &lookup, &mut cache, &mut out).unwrap();
        assert_eq!(out, [0, 1]);
        let d2: DictionaryArray<Int32Type> = vec!["b", "c"].into_iter().collect();
        strings_to_index(&d2, &lookup, &mut cache, &mut out).unwrap();
        assert_eq!(out, [1, 2]);
    }

    #[test]
    fn alternating_dictionaries_are_each_mapped_once() {
        let lookup = Lookup::Hash(1 << 20);
        let mut cache = DictCache::default();
        let dicts: Vec<DictionaryArray<Int32Type>> = (0..DICTS)
            .map(|d| {
                let values: Vec<String> = (0..3).map(|k| format!("{d}-{k}")).collect();
                values.iter().map(String::as_str).collect()
            })
            .collect();
        let mut out = vec![0; 3];
        let mut mapped = Vec::new();
        for round in 0..3 {
            for d in &dicts {
                strings_to_index(d, &lookup, &mut cache, &mut out).unwrap();
                let want: Vec<i64> = (0..3)
                    .map(|k| lookup.index(d.values().as_string::<i32>().value(k).as_bytes()))
                    .collect();
                assert_eq!(out, want);
                let first = cache.recent[0].1.as_ptr();
                match round {
                    0 => mapped.push(first),
                    // Not mapped again: the same mapping as the first round's.
                    _ => assert!(mapped.contains(&first)),
                }
            }
        }
        assert_eq!(cache.recent.len(), DICTS);
    }

    #[test]
    fn an_empty_dictionary_maps_everything_to_missing() {
        let keys = Int8Array::from(vec![None, None]);
        let dict = DictionaryArray::new(keys, Arc::new(StringArray::from(Vec::<&str>::new())));
        let mut out = vec![0; 2];
        strings_to_index(&dict, &Lookup::Hash(4), &mut DictCache::default(), &mut out).unwrap();
        assert_eq!(out, [4, 4]);
    }

    #[test]
    fn out_of_range_keys_under_nulls_are_safe() {
        let keys = Int8Array::from(vec![Some(0), None]);
        let values = Arc::new(StringArray::from(vec!["a"]));
        let dict = DictionaryArray::new(keys, values);
        let mut out = vec![0; 2];
        strings_to_index(&dict, &Lookup::Hash(4), &mut DictCache::default(), &mut out).unwrap();
        assert_eq!(out[1], 4);
    }

    #[test]
    fn one_hot_sets_one_slot_per_row() {
        let mut out = vec![0f32; 3 * 4];
        one_hot(&[0, 2, 9], 3, 4, 1, &mut out);
        assert_eq!(out, [0., 1., 0., 0., 0., 0., 0., 1., 0., 0., 0., 0.]);
    }
}
