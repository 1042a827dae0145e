//! `Batch`: the record a hydrant dataflow moves, a RecordBatch with its place in the input.
//! Between processes it travels as Arrow IPC bytes inside timely's own containers.

use arrow::array::{Array, RecordBatch};
use arrow::buffer::Buffer;
use arrow::error::ArrowError;
use arrow::ipc::reader::StreamDecoder;
use arrow::ipc::writer::StreamWriter;
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::ser::{SerializeTuple, Serializer};
use serde::{Deserialize, Serialize};

/// A RecordBatch and its sequence number: the batch's position among all batches of the
/// input (or of an epoch), which routes it and orders it.
#[derive(Debug, Clone)]
pub struct Batch {
    /// Position among the input's batches.
    pub seq: u64,
    /// The rows.
    pub data: RecordBatch,
}

impl Batch {
    /// The batch as an Arrow IPC stream (schema message, then the batch).
    pub fn to_ipc(&self) -> Result<Vec<u8>, ArrowError> {
        // Sized for the rows up front: growing the buffer would copy them again.
        let rows: usize = self
            .data
            .columns()
            .iter()
            .map(|c| c.to_data().get_slice_memory_size().unwrap_or(0))
            .sum();
        let room = rows + self.data.num_columns() * 256 + 4096;
        let mut w = StreamWriter::try_new(Vec::with_capacity(room), self.data.schema_ref())?;
        w.write(&self.data)?;
        w.into_inner()
    }

    /// Reads a batch written by [`Batch::to_ipc`]. Its arrays point into `bytes`, which
    /// they take over: nothing is copied (buffers not aligned for their type excepted).
    pub fn from_ipc(seq: u64, bytes: Vec<u8>) -> Result<Batch, ArrowError> {
        let mut rest = Buffer::from_vec(bytes);
        let mut decoder = StreamDecoder::new();
        while !rest.is_empty() {
            if let Some(data) = decoder.decode(&mut rest)? {
                return Ok(Batch { seq, data });
            }
        }
        Err(ArrowError::IpcError("IPC stream holds no batch".into()))
    }
}

struct Bytes<'a>(&'a [u8]);

impl Serialize for Bytes<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(self.0)
    }
}

impl Serialize for Batch {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let ipc = self.to_ipc().map_err(serde::ser::Error::custom)?;
        let mut t = s.serialize_tuple(2)?;
        t.serialize_element(&self.seq)?;
        t.serialize_element(&Bytes(&ipc))?;
        t.end()
    }
}

struct ByteBuf(Vec<u8>);

impl<'de> Deserialize<'de> for ByteBuf {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = ByteBuf;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("Arrow IPC bytes")
            }
            fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<ByteBuf, E> {
                Ok(ByteBuf(v.to_vec()))
            }
            fn visit_byte_buf<E: de::Error>(self, v: Vec<u8>) -> Result<ByteBuf, E> {
                Ok(ByteBuf(v))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<ByteBuf, A::Error> {
                let mut v = Vec::new();
                while let Some(b) = seq.next_element()? {
                    v.push(b);
                }
                Ok(ByteBuf(v))
            }
        }
        d.deserialize_byte_buf(V)
    }
}

impl<'de> Deserialize<'de> for Batch {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let (seq, ByteBuf(bytes)) = <(u64, ByteBuf)>::deserialize(d)?;
        Batch::from_ipc(seq, bytes).map_err(de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Float64Array, Int64Array, StringArray};
    use std::sync::Arc;

    #[test]
    fn round_trips_through_json_and_ipc() {
        let data = RecordBatch::try_from_iter([
            (
                "x",
                Arc::new(Float64Array::from(vec![Some(1.0), None])) as _,
            ),
            ("s", Arc::new(StringArray::from(vec!["a", "b"])) as _),
        ])
        .unwrap();
        let batch = Batch { seq: 7, data };
        let json = serde_json::to_string(&batch).unwrap();
        let back: Batch = serde_json::from_str(&json).unwrap();
        assert_eq!(back.seq, 7);
        assert_eq!(back.data, batch.data);
        assert!(Batch::from_ipc(0, b"not ipc".to_vec()).is_err());
        assert!(Batch::from_ipc(0, Vec::new()).is_err());
    }

    #[test]
    fn a_slice_is_decoded_in_place_and_a_cut_stream_is_an_error() {
        let whole = RecordBatch::try_from_iter([(
            "x",
            Arc::new(Int64Array::from_iter(
                (0..10_000).map(|i| (i % 7 != 0).then_some(i)),
            )) as _,
        )])
        .unwrap();
        let batch = Batch {
            seq: 3,
            data: whole.slice(5_000, 4_096),
        };
        let ipc = batch.to_ipc().unwrap();
        assert!(
            ipc.len() < 40_000,
            "only the slice's rows: {} bytes",
            ipc.len()
        );
        let cut = ipc[..ipc.len() - 100].to_vec();
        let held = ipc.as_ptr_range();
        let back = Batch::from_ipc(3, ipc).unwrap();
        assert_eq!(back.data, batch.data);
        let values = back.data.column(0).to_data().buffers()[0].as_ptr();
        assert!(
            held.contains(&values),
            "the values were copied out of the bytes"
        );
        assert!(Batch::from_ipc(3, cut).is_err());
    }
}
