//! A rank's stream as Flight messages whose bodies share the batches' Arrow buffers.
//!
//! arrow-ipc's `StreamEncoder` lays a batch out as a list of buffers — the message prefix,
//! the flatbuffer header, then the batch's own buffers (not copied) and their padding.
//! [`messages`] cuts that list back into one [`Message`] per IPC message, so that the
//! DoGet route (`doget.rs`) can hand the body to the socket without a user-space copy.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use arrow::array::RecordBatch;
use arrow::buffer::Buffer;
use arrow::datatypes::SchemaRef;
use arrow::ipc::MessageHeader;
use arrow::ipc::writer::{IpcWriteOptions, StreamEncoder};
use arrow_flight::{FlightData, SchemaAsIpc};
use bytes::Bytes;
use futures::stream::{Stream, StreamExt};
use tonic::Status;

use crate::served::{BatchMeta, RankStream};
use crate::service::MESSAGE_TARGET_BYTES;

/// One Flight message: an IPC header, the batch's metadata, and its body as the Arrow
/// buffers it shares with the batch (padding included).
#[derive(Debug, Clone)]
pub(crate) struct Message {
    /// The flatbuffer IPC message (`FlightData.data_header`).
    pub header: Bytes,
    /// [`BatchMeta`] JSON on record batches; empty otherwise.
    pub app_metadata: Bytes,
    /// The body (`FlightData.data_body`), in pieces.
    pub body: Vec<Bytes>,
}

impl Message {
    /// Bytes in the body.
    pub fn body_len(&self) -> usize {
        self.body.iter().map(Bytes::len).sum()
    }

    /// As arrow-flight's [`FlightData`], the body copied into one buffer (for tonic's codec).
    pub fn into_flight_data(self) -> FlightData {
        let body = match self.body.as_slice() {
            [] => Bytes::new(),
            [one] => one.clone(),
            many => Bytes::from(many.concat()),
        };
        FlightData::new()
            .with_data_header(self.header)
            .with_app_metadata(self.app_metadata)
            .with_data_body(body)
    }
}

/// An IPC message as [`messages`] finds it in the encoder's output.
struct Ipc {
    kind: MessageHeader,
    header: Bytes,
    body: Vec<Bytes>,
}

/// Cuts an IPC stream, as `StreamEncoder` lays it out in buffers, into its messages.
/// Errs if the buffers do not fall on message boundaries (a layout this code does not know).
fn messages(buffers: Vec<Buffer>) -> Result<Vec<Ipc>, String> {
    let unknown = |what: &str| format!("unexpected IPC encoder layout: {what}");
    // The encoder may emit empty buffers (an absent validity bitmap); they carry nothing.
    let mut buffers = buffers.into_iter().filter(|b| !b.is_empty());
    let mut out = Vec::new();
    while let Some(prefix) = buffers.next() {
        let (marker, len) = match prefix.as_slice() {
            [a, b, c, d, e, f, g, h] => (
                u32::from_le_bytes([*a, *b, *c, *d]),
                i32::from_le_bytes([*e, *f, *g, *h]),
            ),
            _ => return Err(unknown("a message prefix that is not 8 bytes")),
        };
        if marker != u32::MAX || len < 0 {
            return Err(unknown("a message without the continuation marker"));
        }
        if len == 0 {
            continue; // end of stream
        }
        let header = buffers
            .next()
            .filter(|h| h.len() <= len as usize)
            .ok_or_else(|| unknown("a prefix without its header"))?;
        take(&mut buffers, len as usize - header.len())
            .ok_or_else(|| unknown("header padding across buffers"))?;
        let message = arrow::ipc::root_as_message(&header).map_err(|e| unknown(&e.to_string()))?;
        let (kind, body_len) = (message.header_type(), message.bodyLength());
        let body = take(
            &mut buffers,
            usize::try_from(body_len).unwrap_or(usize::MAX),
        )
        .ok_or_else(|| unknown("a body that does not end on a buffer"))?;
        out.push(Ipc {
            kind,
            header: Bytes::from(header),
            body,
        });
    }
    Ok(out)
}

/// Takes buffers adding up to exactly `len` bytes (`None` if they do not).
fn take(buffers: &mut impl Iterator<Item = Buffer>, len: usize) -> Option<Vec<Bytes>> {
    let (mut taken, mut out) = (0, Vec::new());
    while taken < len {
        let b = buffers.next()?;
        taken += b.len();
        out.push(Bytes::from(b));
    }
    (taken == len).then_some(out)
}

/// Encodes a rank's stream as Flight messages, in the task that polls it (the stream it
/// reads never blocks). The schema goes first; a step larger than [`MESSAGE_TARGET_BYTES`]
/// goes as several messages. A clean end whose last batch did not say `last` gets a
/// zero-row batch whose metadata does (`end`, moved past the last step sent): every decoder
/// reads that, while a message of metadata alone is read by arrow C++ only with an empty
/// IPC header, which arrow-rs rejects.
pub(crate) struct Encoder {
    schema: SchemaRef,
    batches: RankStream,
    end: BatchMeta,
    /// Messages encoded and not yet yielded.
    queued: VecDeque<Result<Message, Status>>,
    ipc: Option<StreamEncoder>,
    /// Set once the input has ended (cleanly or not).
    finished: bool,
}

impl Encoder {
    pub fn new(schema: SchemaRef, batches: RankStream, end: BatchMeta) -> Self {
        let options = IpcWriteOptions::default();
        let first = FlightData::from(SchemaAsIpc::new(&schema, &options));
        let (ipc, first) = match StreamEncoder::try_new_with_options(&schema, options) {
            Ok(ipc) => (
                Some(ipc),
                Ok(Message {
                    header: first.data_header,
                    app_metadata: Bytes::new(),
                    body: Vec::new(),
                }),
            ),
            Err(e) => (None, Err(Status::internal(e.to_string()))),
        };
        Encoder {
            finished: first.is_err(),
            schema,
            batches,
            end,
            queued: [first].into(),
            ipc,
        }
    }

    /// Queues `batch`'s messages, each record batch with `meta` as its `app_metadata`
    /// (stamped with the job the end's metadata names).
    fn queue(&mut self, meta: &BatchMeta, batch: &RecordBatch) {
        let meta = BatchMeta {
            job: self.end.job,
            ..*meta
        };
        let metadata = Bytes::from(serde_json::to_vec(&meta).unwrap_or_default());
        let Some(ipc) = &mut self.ipc else { return };
        for piece in split(batch) {
            let encoded = ipc
                .encode(&piece)
                .map_err(|e| e.to_string())
                .and_then(messages);
            let encoded = match encoded {
                Ok(encoded) => encoded,
                Err(e) => {
                    self.queued.push_back(Err(Status::internal(e)));
                    self.finished = true;
                    return;
                }
            };
            // The stream's schema went first already.
            for m in encoded
                .into_iter()
                .filter(|m| m.kind != MessageHeader::Schema)
            {
                let app_metadata = match m.kind {
                    MessageHeader::RecordBatch => metadata.clone(),
                    _ => Bytes::new(),
                };
                self.queued.push_back(Ok(Message {
                    header: m.header,
                    app_metadata,
                    body: m.body,
                }));
            }
        }
    }
}

impl Stream for Encoder {
    type Item = Result<Message, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        loop {
            if let Some(message) = this.queued.pop_front() {
                return Poll::Ready(Some(message));
            }
            if this.finished {
                return Poll::Ready(None);
            }
            match std::task::ready!(this.batches.poll_next_unpin(cx)) {
                Some(Ok((meta, batch))) => {
                    this.end.step = meta.step + 1;
                    this.end.state_version = meta.state_version;
                    if meta.last {
                        this.end.last = false;
                    }
                    this.queue(&meta, &batch);
                }
                Some(Err(e)) => {
                    this.finished = true;
                    return Poll::Ready(Some(Err(e.into())));
                }
                None => {
                    this.finished = true;
                    if this.end.last {
                        let (end, empty) = (this.end, RecordBatch::new_empty(this.schema.clone()));
                        this.queue(&end, &empty);
                    }
                }
            }
        }
    }
}

/// The bytes of a batch's rows, not of the buffers a slice shares with its parent.
pub fn batch_bytes(batch: &RecordBatch) -> usize {
    batch
        .columns()
        .iter()
        .map(|c| c.to_data().get_slice_memory_size().unwrap_or(0))
        .sum()
}

/// Slices `batch` into pieces of about [`MESSAGE_TARGET_BYTES`] (zero-copy).
fn split(batch: &RecordBatch) -> Vec<RecordBatch> {
    let bytes = batch_bytes(batch).max(1);
    let rows = batch.num_rows();
    if bytes <= MESSAGE_TARGET_BYTES || rows <= 1 {
        return vec![batch.clone()];
    }
    let per = (rows * MESSAGE_TARGET_BYTES / bytes).max(1);
    (0..rows)
        .step_by(per)
        .map(|at| batch.slice(at, per.min(rows - at)))
        .collect()
}
