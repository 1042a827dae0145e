//! DoGet without a user-space copy of the batches.
//!
//! tonic's codec encodes every message into a buffer of its own, so a 4 MiB step would be
//! copied there after the IPC encoder. This route answers DoGet itself, in front of the
//! generated service: it frames each [`Message`] by hand — the gRPC length prefix and the
//! `FlightData` protobuf fields — and hands the body to hyper as the `Bytes` that share the
//! batch's Arrow buffers. h2 writes those buffers to the socket as they are (it chains,
//! rather than copies, payloads over 256 bytes), so the kernel's copy is the only one, as in
//! Arrow C++'s server. Every other call goes to the generated service.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use arrow_flight::flight_service_server::FlightServiceServer;
use bytes::{BufMut, Bytes, BytesMut};
use futures::StreamExt;
use http_body::{Body as _, Frame};
use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint, key_len};
use tonic::Status;
use tonic::codegen::{BoxFuture, Service, http};
use tonic::server::NamedService;

use crate::encode::{Encoder, Message};
use crate::service::FlightServer;

/// The path of the method this route answers.
const DO_GET: &str = "/arrow.flight.protocol.FlightService/DoGet";
/// `FlightData` field numbers (Flight.proto).
const HEADER_FIELD: u32 = 2;
const APP_METADATA_FIELD: u32 = 3;
const BODY_FIELD: u32 = 1000;
/// Body pieces smaller than this (padding, short buffers) are copied in with the framing
/// before them: each piece handed to hyper costs an HTTP/2 frame, and a `writev`, of its
/// own. At 128 KiB rather than 64, an 8,192-row message's row ids and labels (96 KiB) are
/// one write, not two: 4,162 against 3,225 writes over 4 pulls of four streams, and in 5
/// alternated pairs 2.07 against 2.25 GB/s, the copy included.
const COPY_BELOW: usize = 128 << 10;
/// Copied chunks up to this size (a message's framing, a trailing validity bitmap) go to
/// hyper in pieces of [`H2_COPIES_BELOW`] bytes at most.
const COALESCE_UP_TO: usize = 4 << 10;
/// h2 copies a DATA frame shorter than this (its `CHAIN_THRESHOLD`) into its write buffer,
/// where it waits for the next frame; a longer one it writes with what is buffered in a
/// `writev` of its own. So a message's framing, cut this small, goes out with the large
/// body piece after it rather than in a `writev` of a few hundred bytes that wakes the
/// reader for nothing (two of a 16,384-row step's ~6 writes were such).
const H2_COPIES_BELOW: usize = 256;
/// A DoGet request is one `Ticket`; anything longer is refused before it is read.
const MAX_TICKET_BYTES: usize = 64 << 10;

/// The Flight service, with DoGet answered by [`do_get`].
#[derive(Clone)]
pub(crate) struct Route {
    server: Arc<FlightServer>,
    generated: FlightServiceServer<FlightServer>,
}

impl Route {
    pub fn new(server: Arc<FlightServer>, generated: FlightServiceServer<FlightServer>) -> Self {
        Route { server, generated }
    }
}

impl NamedService for Route {
    const NAME: &'static str = <FlightServiceServer<FlightServer> as NamedService>::NAME;
}

impl Service<http::Request<tonic::body::Body>> for Route {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Service::<http::Request<tonic::body::Body>>::poll_ready(&mut self.generated, cx)
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        if request.uri().path() != DO_GET {
            let answer = self.generated.call(request);
            return Box::pin(async move {
                let mut response = answer.await?;
                undecodable_is_invalid_argument(&mut response);
                Ok(response)
            });
        }
        let server = self.server.clone();
        Box::pin(async move {
            Ok(do_get(&server, request)
                .await
                .unwrap_or_else(Status::into_http))
        })
    }
}

/// tonic refuses a request message that does not decode (a descriptor path that is not
/// UTF-8, say) with INTERNAL, which the README keeps for the server's own failures: the
/// error is the client's, INVALID_ARGUMENT. Such a refusal is a response of headers only,
/// so its status is rewritten there.
fn undecodable_is_invalid_argument<B>(response: &mut http::Response<B>) {
    let headers = response.headers_mut();
    let internal = headers.get("grpc-status").is_some_and(|s| s == "13");
    let undecodable = headers
        .get("grpc-message")
        .and_then(|m| m.to_str().ok())
        .is_some_and(|m| {
            m.replace("%20", " ")
                .starts_with("failed to decode Protobuf message")
        });
    if internal && undecodable {
        let code = (tonic::Code::InvalidArgument as i32).to_string();
        if let Ok(code) = http::HeaderValue::from_str(&code) {
            headers.insert("grpc-status", code);
        }
    }
}

/// Answers one DoGet: the ticket's rank stream, or the status that refuses it.
async fn do_get(
    server: &FlightServer,
    request: http::Request<tonic::body::Body>,
) -> Result<http::Response<tonic::body::Body>, Status> {
    let (parts, body) = request.into_parts();
    let token = parts
        .headers
        .get("authorization")
        .and_then(|v| v.to_str().ok());
    server.check_token(token, Some(crate::auth::Role::Train))?;
    let ticket = read_ticket(body).await?;
    let encoder = server.open_rank(&ticket)?;
    let body = Frames {
        encoder,
        queued: VecDeque::new(),
        done: false,
    };
    http::Response::builder()
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .body(tonic::body::Body::new(body))
        .map_err(|e| Status::internal(e.to_string()))
}

/// Reads the request's one length-prefixed `Ticket` message, and decodes it.
async fn read_ticket(mut body: tonic::body::Body) -> Result<Vec<u8>, Status> {
    let mut read = BytesMut::new();
    let wanted = loop {
        if read.len() >= 5 {
            let wanted = 5 + u32::from_be_bytes([read[1], read[2], read[3], read[4]]) as usize;
            if wanted > MAX_TICKET_BYTES {
                return Err(Status::resource_exhausted(format!(
                    "DoGet ticket of {} bytes is over the {MAX_TICKET_BYTES} accepted",
                    wanted - 5
                )));
            }
            if read.len() >= wanted {
                break wanted;
            }
        }
        let frame = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx));
        match frame.await {
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    read.extend_from_slice(&data);
                }
            }
            Some(Err(e)) => return Err(Status::cancelled(format!("DoGet request: {e}"))),
            None => return Err(Status::invalid_argument("DoGet request holds no ticket")),
        }
    };
    if read[0] != 0 {
        return Err(Status::unimplemented(
            "compressed DoGet requests are not supported",
        ));
    }
    let ticket = <arrow_flight::Ticket as prost::Message>::decode(&read[5..wanted])
        .map_err(|e| Status::invalid_argument(format!("DoGet request is not a Ticket: {e}")))?;
    Ok(ticket.ticket.to_vec())
}

/// The response body: each message framed for gRPC, then the call's status as trailers.
struct Frames {
    encoder: Encoder,
    queued: VecDeque<Bytes>,
    done: bool,
}

impl http_body::Body for Frames {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = &mut *self;
        loop {
            if let Some(chunk) = this.queued.pop_front() {
                return Poll::Ready(Some(Ok(Frame::data(chunk))));
            }
            if this.done {
                return Poll::Ready(None);
            }
            let status = match std::task::ready!(this.encoder.poll_next_unpin(cx)) {
                Some(Ok(message)) => match frame(message, &mut this.queued) {
                    Ok(()) => continue,
                    Err(status) => status,
                },
                Some(Err(status)) => status,
                None => Status::ok(""),
            };
            this.done = true;
            let mut trailers = http::HeaderMap::new();
            if status.add_header(&mut trailers).is_err() {
                // A message no header can carry: the code alone still says what happened.
                Status::new(status.code(), "")
                    .add_header(&mut trailers)
                    .ok();
            }
            return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
        }
    }
}

/// Frames `message` as a length-prefixed `FlightData` protobuf into `out`: the framing and
/// small body pieces copied into shared chunks, large body pieces as they are.
fn frame(message: Message, out: &mut VecDeque<Bytes>) -> Result<(), Status> {
    let body_len = message.body_len();
    let len = field_len(HEADER_FIELD, message.header.len())
        + field_len(APP_METADATA_FIELD, message.app_metadata.len())
        + field_len(BODY_FIELD, body_len);
    let len = u32::try_from(len)
        .map_err(|_| Status::internal(format!("a message of {len} bytes is over gRPC's 4 GiB")))?;
    // Room for every copied byte up front: growing the chunk as small pieces come would
    // copy them again.
    let copied: usize = message
        .body
        .iter()
        .map(Bytes::len)
        .filter(|&n| n < COPY_BELOW)
        .sum();
    let mut chunk =
        BytesMut::with_capacity(64 + message.header.len() + message.app_metadata.len() + copied);
    chunk.put_u8(0); // not compressed
    chunk.put_u32(len);
    put_field(&mut chunk, HEADER_FIELD, &message.header);
    put_field(&mut chunk, APP_METADATA_FIELD, &message.app_metadata);
    if body_len > 0 {
        encode_key(BODY_FIELD, WireType::LengthDelimited, &mut chunk);
        encode_varint(body_len as u64, &mut chunk);
    }
    for piece in message.body {
        if piece.len() < COPY_BELOW {
            chunk.extend_from_slice(&piece);
        } else {
            push_copied(chunk.split().freeze(), out);
            out.push_back(piece);
        }
    }
    push_copied(chunk.freeze(), out);
    Ok(())
}

/// Queues a chunk of copied bytes, a small one in pieces h2 coalesces with the frame after
/// them (see [`H2_COPIES_BELOW`]); the pieces share the chunk's memory.
fn push_copied(mut chunk: Bytes, out: &mut VecDeque<Bytes>) {
    if chunk.len() > COALESCE_UP_TO {
        out.push_back(chunk);
        return;
    }
    while !chunk.is_empty() {
        let n = chunk.len().min(H2_COPIES_BELOW - 1);
        out.push_back(chunk.split_to(n));
    }
}

/// Encoded length of a `bytes` field of `len` bytes (proto3 leaves empty ones out).
fn field_len(tag: u32, len: usize) -> usize {
    match len {
        0 => 0,
        n => key_len(tag) + encoded_len_varint(n as u64) + n,
    }
}

fn put_field(out: &mut BytesMut, tag: u32, value: &[u8]) {
    if !value.is_empty() {
        encode_key(tag, WireType::LengthDelimited, out);
        encode_varint(value.len() as u64, out);
        out.put_slice(value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_flight::FlightData;

    /// The hand framing decodes, with prost, to what tonic's codec would have sent.
    #[test]
    fn frames_decode_to_the_flight_data_tonic_would_send() {
        let big = Bytes::from(vec![7u8; COPY_BELOW + 3]);
        let cases = [
            (b"hdr".to_vec(), b"{\"step\":1}".to_vec(), vec![]),
            (
                b"h".to_vec(),
                vec![],
                vec![Bytes::from_static(b"abc"), big.clone()],
            ),
            (
                vec![1; 300],
                vec![2; 200],
                vec![big.clone(), Bytes::from_static(b"x"), big],
            ),
        ];
        for (header, app_metadata, body) in cases {
            let message = Message {
                header: header.into(),
                app_metadata: app_metadata.into(),
                body,
            };
            let mut out = VecDeque::new();
            frame(message.clone(), &mut out).unwrap();
            let wire: Vec<u8> = out.iter().flat_map(|b| b.iter().copied()).collect();
            assert_eq!(wire[0], 0);
            let len = u32::from_be_bytes(wire[1..5].try_into().unwrap()) as usize;
            assert_eq!(wire.len(), 5 + len);
            let decoded = <FlightData as prost::Message>::decode(&wire[5..]).unwrap();
            assert_eq!(decoded, message.into_flight_data());
        }
    }

    /// Large body pieces go to hyper as the very buffers they were (no copy).
    #[test]
    fn large_pieces_are_not_copied() {
        let big = Bytes::from(vec![7u8; 1 << 20]);
        let message = Message {
            header: Bytes::from_static(b"h"),
            app_metadata: Bytes::new(),
            body: vec![Bytes::from_static(&[0; 8]), big.clone()],
        };
        let mut out = VecDeque::new();
        frame(message, &mut out).unwrap();
        assert_eq!(out.back().unwrap().as_ptr(), big.as_ptr());
        // The framing before it goes in pieces h2 copies into its buffer.
        assert!(out.iter().rev().skip(1).all(|b| b.len() < H2_COPIES_BELOW));
    }
}
