//! How pieces cross processes: [`Pieces`], the container the exchange to the owners
//! carries, and its bytes.
//!
//! timely's own container, `Vec<Piece>`, goes through bincode, which cannot hand the
//! decoder the buffer it reads from: every crossing row was copied out of timely's receive
//! buffer into a fresh allocation, and on the way out it was encoded into a `Vec` before
//! being written. Here a piece's rows are written straight from the featurized batch's
//! buffers into timely's send buffer (arrow's `StreamEncoder` shares them), and read back
//! in place: the decoded arrays point into the bytes timely received.
//!
//! The layout, in little-endian `u64` words so that every IPC stream starts 8-aligned:
//!
//! ```text
//! pieces
//! per piece: epoch, rank, n, n indices, len, len bytes of Arrow IPC (schema, batch), zeros to a multiple of 8
//! ```

use std::ptr::NonNull;
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::buffer::Buffer;
use arrow::ipc::reader::StreamDecoder;
use arrow::ipc::writer::StreamEncoder;
use timely::bytes::arc::Bytes;
use timely::container::{Accountable, DrainContainer, PushInto, SizableContainer};
use timely::dataflow::channels::ContainerBytes;

use super::piece::Piece;

/// Pieces bound for one worker: what the exchange from readers to owners carries.
///
/// Between workers of one process it moves by pointer; between processes it is written
/// and read by [`ContainerBytes`] as the module says. One that arrived broken (which only a
/// fault in the transport could do) holds no pieces and says why.
#[derive(Debug, Clone, Default)]
pub struct Pieces {
    items: Vec<Piece>,
    /// A message that could not be read: the pieces it announced (what progress tracking
    /// counts), and why.
    broken: Option<(usize, String)>,
}

impl Pieces {
    /// Takes the pieces out, or why they could not be read.
    pub fn take(&mut self) -> std::result::Result<std::vec::Drain<'_, Piece>, String> {
        match &self.broken {
            Some((_, why)) => Err(why.clone()),
            None => Ok(self.items.drain(..)),
        }
    }
}

impl Accountable for Pieces {
    fn record_count(&self) -> i64 {
        let count = self.broken.as_ref().map_or(self.items.len(), |(n, _)| *n);
        i64::try_from(count).unwrap_or(i64::MAX)
    }
}

impl DrainContainer for Pieces {
    type Item<'a> = Piece;
    type DrainIter<'a> = std::vec::Drain<'a, Piece>;

    fn drain(&mut self) -> Self::DrainIter<'_> {
        self.items.drain(..)
    }
}

impl SizableContainer for Pieces {
    fn at_capacity(&self) -> bool {
        self.items.at_capacity()
    }

    fn ensure_capacity(&mut self, stash: &mut Option<Self>) {
        let mut items = stash.take().map(|s| s.items);
        self.items.ensure_capacity(&mut items);
    }
}

impl PushInto<Piece> for Pieces {
    fn push_into(&mut self, item: Piece) {
        self.items.push(item);
    }
}

impl ContainerBytes for Pieces {
    fn from_bytes(mut bytes: Bytes) -> Self {
        let mut words = Words { bytes: &mut bytes };
        let (count, items) = match words.next() {
            Ok(count) => (count, read(&mut words, count)),
            Err(why) => (0, Err(why)),
        };
        match items {
            Ok(items) => Pieces {
                items,
                broken: None,
            },
            Err(why) => Pieces {
                items: Vec::new(),
                broken: Some((
                    usize::try_from(count).unwrap_or(usize::MAX),
                    format!("a piece from another process cannot be read: {why}"),
                )),
            },
        }
    }

    fn length_in_bytes(&self) -> usize {
        let pieces: usize = self
            .items
            .iter()
            .map(|p| {
                let ipc = p.wire().as_ref().map_or(0, |w| w.len);
                8 * (4 + p.len()) + padded(ipc)
            })
            .sum();
        8 + pieces
    }

    fn into_bytes<W: std::io::Write>(&self, writer: &mut W) {
        // timely's writer is a slice it sized with `length_in_bytes`: writing cannot fail,
        // and timely offers no way to report it if it did.
        let _ = write(&self.items, writer);
    }
}

fn write<W: std::io::Write>(items: &[Piece], w: &mut W) -> std::io::Result<()> {
    let word = |w: &mut W, v: u64| w.write_all(&v.to_le_bytes());
    word(w, items.len() as u64)?;
    for p in items {
        let (buffers, len) = match p.wire() {
            Ok(wire) => (wire.buffers.as_slice(), wire.len),
            // Sent as a piece without rows, which the receiver refuses: the error itself
            // has no way through timely's serialization.
            Err(_) => (&[][..], 0),
        };
        word(w, p.epoch)?;
        word(w, p.rank as u64)?;
        word(w, p.len() as u64)?;
        for i in p.indices() {
            word(w, i)?;
        }
        word(w, len as u64)?;
        for b in buffers {
            w.write_all(b.as_slice())?;
        }
        w.write_all(&[0; 8][..padded(len) - len])?;
    }
    Ok(())
}

/// The `count` pieces that follow the count word.
fn read(words: &mut Words, count: u64) -> std::result::Result<Vec<Piece>, String> {
    let mut items = Vec::with_capacity(count.min(1024) as usize);
    for _ in 0..count {
        let (epoch, rank, n) = (words.next()?, words.next()?, words.next()?);
        let indices = words.many(n)?;
        let len = usize::try_from(words.next()?).map_err(|e| e.to_string())?;
        let ipc = words.take(len)?;
        words.take(padded(len) - len)?;
        let batch = decode(ipc).map_err(|e| format!("piece of rank {rank}: {e}"))?;
        if batch.num_rows() != indices.len() {
            return Err(format!(
                "a piece of rank {rank} holds {} rows for {} indices",
                batch.num_rows(),
                indices.len()
            ));
        }
        items.push(Piece::new(epoch, rank as usize, indices, batch));
    }
    Ok(items)
}

/// Reads `u64` words and byte runs off the front of received bytes.
struct Words<'a> {
    bytes: &'a mut Bytes,
}

impl Words<'_> {
    fn take(&mut self, len: usize) -> std::result::Result<Bytes, String> {
        if len > self.bytes.len() {
            return Err(format!("it ends {} bytes short", len - self.bytes.len()));
        }
        Ok(self.bytes.extract_to(len))
    }

    fn next(&mut self) -> std::result::Result<u64, String> {
        let w = self.take(8)?;
        Ok(u64::from_le_bytes(
            w[..].try_into().map_err(|_| "a short word")?,
        ))
    }

    fn many(&mut self, n: u64) -> std::result::Result<Vec<u64>, String> {
        let len = usize::try_from(n)
            .ok()
            .and_then(|n| n.checked_mul(8))
            .ok_or("too many indices")?;
        let w = self.take(len)?;
        Ok(w.chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()))
            .collect())
    }
}

/// `len` rounded up to a multiple of 8.
fn padded(len: usize) -> usize {
    len.div_ceil(8) * 8
}

/// A piece's rows as an Arrow IPC stream (the schema message, then the batch's) in the
/// buffers arrow's `StreamEncoder` lays it out in: the body's buffers are the batch's own.
#[derive(Debug, Clone)]
pub(super) struct Wire {
    buffers: Vec<Buffer>,
    /// Bytes in all of `buffers`.
    len: usize,
}

impl Wire {
    pub(super) fn encode(batch: &RecordBatch) -> std::result::Result<Wire, String> {
        let mut encoder = StreamEncoder::try_new(batch.schema_ref()).map_err(|e| e.to_string())?;
        let buffers: Vec<Buffer> = encoder
            .encode(batch)
            .map_err(|e| e.to_string())?
            .into_iter()
            .filter(|b| !b.is_empty())
            .collect();
        let len = buffers.iter().map(Buffer::len).sum();
        Ok(Wire { buffers, len })
    }

    /// Whether one of the buffers written is `ptr`'s (shared, not copied).
    #[cfg(test)]
    pub(super) fn shares(&self, ptr: *const u8) -> bool {
        self.buffers.iter().any(|b| b.as_ptr() == ptr)
    }
}

/// Decodes an IPC stream whose arrays then point into `bytes` (arrow copies only a buffer
/// that is not aligned for its type).
fn decode(bytes: Bytes) -> std::result::Result<RecordBatch, String> {
    let mut rest = shared(bytes);
    let mut decoder = StreamDecoder::new();
    while !rest.is_empty() {
        if let Some(batch) = decoder.decode(&mut rest).map_err(|e| e.to_string())? {
            return Ok(batch);
        }
    }
    Err("its IPC stream holds no batch".into())
}

/// An arrow buffer over received bytes, which it keeps alive.
fn shared(bytes: Bytes) -> Buffer {
    let Some(ptr) = NonNull::new(bytes.as_ptr().cast_mut()) else {
        return Buffer::from_vec(Vec::<u8>::new());
    };
    let len = bytes.len();
    // SAFETY: `ptr` and `len` describe the bytes `bytes` views, and the buffer owns
    // `bytes`: timely's `Bytes` is a read-only view of a shared allocation that is neither
    // freed nor written again while any view of it lives (other views write only disjoint
    // ranges), so the memory stays valid and unchanged for the buffer's life.
    unsafe {
        Buffer::from_custom_allocation(ptr, len, Arc::new(std::panic::AssertUnwindSafe(bytes)))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Array, FixedSizeListArray, Float32Array, Int64Array, UInt64Array};
    use arrow::datatypes::{DataType, Field, Schema};
    use timely::bytes::arc::BytesMut;

    use super::*;
    use crate::delivery::piece::split;
    use crate::delivery::placement::{LastBatch, Placement};

    /// Writes `pieces` as timely does (sized first, then written into that many bytes)
    /// and reads them back.
    fn cross(pieces: Vec<Piece>) -> (Vec<u8>, Pieces) {
        let mut sent = Pieces::default();
        for p in pieces {
            sent.push_into(p);
        }
        let mut bytes = Vec::new();
        sent.into_bytes(&mut bytes);
        assert_eq!(bytes.len(), sent.length_in_bytes());
        let back = Pieces::from_bytes(BytesMut::from(bytes.clone()).freeze());
        assert_eq!(back.record_count(), sent.record_count());
        (bytes, back)
    }

    fn batch(n: usize) -> RecordBatch {
        let ids = Int64Array::from_iter_values(0..n as i64 * 3);
        let tensor = FixedSizeListArray::try_new(
            Arc::new(Field::new("item", DataType::Int64, false)),
            3,
            Arc::new(ids),
            None,
        )
        .unwrap();
        let dense = Float32Array::from_iter((0..n).map(|i| (i % 7 != 3).then_some(i as f32)));
        RecordBatch::try_from_iter([
            ("dense", Arc::new(dense) as _),
            ("ids", Arc::new(tensor) as _),
        ])
        .unwrap()
    }

    /// Pieces with nulls, a tensor column and runs that start at bit offsets that are not
    /// byte-aligned, in order and shuffled: every rank's rows come back equal; runs in
    /// order go out without a copy, and what arrives is read in place.
    #[test]
    fn pieces_cross_with_nulls_tensors_and_odd_offsets() {
        let n = 1_000;
        let batch = batch(n);
        let values = |b: &RecordBatch| b.column(1).to_data().child_data()[0].buffers()[0].clone();
        for (world, b, shuffle) in [(3, 13, None), (3, 13, Some(64)), (2, 500, None)] {
            let placement = Placement::new(world, b, LastBatch::Pad, 9, shuffle).unwrap();
            let mut pieces = Vec::new();
            split(&placement, 1, n as u64, 0, 0..n as u64, &batch, &mut pieces);
            assert_eq!(pieces.len(), world);
            let want: Vec<_> = pieces
                .iter()
                .map(|p| {
                    (
                        p.epoch,
                        p.rank,
                        p.indices().collect::<Vec<_>>(),
                        p.own_rows().unwrap(),
                    )
                })
                .collect();
            if b == 500 {
                // Each rank's rows are one run: the tensor's values go out as a slice of
                // the batch's own buffer.
                for p in &pieces {
                    let at = values(&batch)
                        .as_ptr()
                        .wrapping_add(p.runs()[0].index as usize * 24);
                    assert!(p.wire().as_ref().unwrap().shares(at), "rank {}", p.rank);
                }
            }
            let (_, mut back) = cross(pieces);
            let got: Vec<_> = back
                .take()
                .unwrap()
                .map(|p| {
                    (
                        p.epoch,
                        p.rank,
                        p.indices().collect::<Vec<_>>(),
                        p.batch().clone(),
                    )
                })
                .collect();
            assert_eq!(got, want, "{world} ranks of {b}, shuffle {shuffle:?}");
        }
    }

    #[test]
    fn received_rows_point_into_the_received_bytes() {
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::UInt64, false)]));
        let rows = Arc::new(UInt64Array::from_iter_values(0..10_000));
        let batch = RecordBatch::try_new(schema, vec![rows]).unwrap();
        let placement = Placement::new(2, 2, LastBatch::Pad, 0, None).unwrap();
        let mut pieces = Vec::new();
        split(
            &placement,
            0,
            10,
            0,
            0..10,
            &batch.slice(0, 10),
            &mut pieces,
        );
        let mut sent = Pieces::default();
        sent.push_into(pieces.remove(1));
        let mut bytes = Vec::new();
        sent.into_bytes(&mut bytes);
        let frozen = BytesMut::from(bytes).freeze();
        let held = frozen[..].as_ptr_range();
        let mut back = Pieces::from_bytes(frozen);
        let p = back.take().unwrap().next().unwrap();
        // Only rank 1's rows crossed.
        assert_eq!(
            (p.epoch, p.rank, p.indices().collect::<Vec<_>>()),
            (0, 1, vec![2, 3, 6, 7])
        );
        let x = p
            .batch()
            .column(0)
            .as_any()
            .downcast_ref::<UInt64Array>()
            .unwrap();
        assert_eq!(x.values().to_vec(), vec![2, 3, 6, 7]);
        assert!(
            held.contains(&x.values().as_ptr().cast()),
            "the rows were copied"
        );
    }

    /// A message cut short or with a wrong length is reported, with the count of pieces it
    /// announced (which progress tracking needs), and nothing panics.
    #[test]
    fn a_broken_message_is_an_error_not_a_panic() {
        let placement = Placement::new(2, 5, LastBatch::Pad, 0, None).unwrap();
        let mut pieces = Vec::new();
        split(&placement, 0, 100, 0, 0..100, &batch(100), &mut pieces);
        let (bytes, _) = cross(pieces);
        let mut cases = vec![
            bytes[..bytes.len() - 8].to_vec(),
            bytes[..20].to_vec(),
            bytes[..3].to_vec(),
        ];
        let mut garbled = bytes.clone();
        garbled[bytes.len() / 2..].fill(0xAB);
        cases.push(garbled);
        // The first piece's IPC length (after its 4 + n words), made too large.
        let n = u64::from_le_bytes(bytes[24..32].try_into().unwrap()) as usize;
        let mut long = bytes.clone();
        long[32 + 8 * n..40 + 8 * n].copy_from_slice(&u64::MAX.to_le_bytes());
        cases.push(long);
        for (k, case) in cases.into_iter().enumerate() {
            let short = case.len() < 8;
            let mut back = Pieces::from_bytes(BytesMut::from(case).freeze());
            let err = back.take().map(|_| ()).unwrap_err();
            assert!(err.contains("cannot be read"), "case {k}: {err}");
            assert_eq!(back.record_count(), if short { 0 } else { 2 }, "case {k}");
        }
    }
}
