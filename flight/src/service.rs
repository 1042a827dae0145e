//! The Flight service over [`Served`] pipelines.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use arrow::ipc::writer::IpcWriteOptions;
use arrow_flight::decode::{DecodedFlightData, DecodedPayload, FlightDataDecoder};
use arrow_flight::flight_service_server::{FlightService, FlightServiceServer};
use arrow_flight::{
    Action, ActionType, Criteria, Empty, FlightData, FlightDescriptor, FlightEndpoint, FlightInfo,
    HandshakeRequest, HandshakeResponse, PollInfo, PutResult, SchemaAsIpc, SchemaResult,
};
use bytes::Bytes;
use futures::stream::{self, BoxStream, Stream, StreamExt, TryStreamExt};
use serde::Deserialize;
use tonic::transport::ServerTlsConfig;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status, Streaming};

use crate::auth::{Auth, Denied, Role};
use crate::doget::Route;
use crate::encode::Encoder;
use crate::idle::{FirstWords, GREETING_TIMEOUT};
use crate::intake::{Intake, PUSHES_HELD};
use crate::local;
use crate::served::{BatchMeta, Origin, ServeError, Served};
use crate::ticket::Ticket;
use crate::tls::identity;

/// How long a server waits after a failed accept (out of file descriptors, most often)
/// before it accepts again, rather than failing at once again and again: the Flight
/// service here, and hydrant's metrics endpoint.
pub const ACCEPT_PAUSE: std::time::Duration = std::time::Duration::from_millis(50);

/// How long a `commit` of a step not yet given to every rank waits for it before it is
/// refused. A restarted server gives the ranks the steps after the last commit again as
/// their trainers reconnect, so a trainer that commits the step it checkpointed at just
/// after a restart would otherwise be refused a step it holds. Waiting costs a task, not
/// a thread.
pub const COMMIT_WAIT: std::time::Duration = std::time::Duration::from_secs(10);
/// How long a failed login waits before its answer.
const FAILED_LOGIN_DELAY: std::time::Duration = std::time::Duration::from_millis(250);

/// The body of the `commit` action.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct CommitRequest {
    pipeline: String,
    step: u64,
}

/// The body of the `state` action.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct StateRequest {
    pipeline: String,
    version: u64,
}

/// Streams one client connection may have open at once (HTTP/2 SETTINGS
/// `MAX_CONCURRENT_STREAMS`): far more than the ranks and actions of one trainer process,
/// which gRPC clients queue beyond it rather than fail.
pub const MAX_STREAMS_PER_CONNECTION: u32 = 256;

/// A `state` reply is sent in results of at most this many bytes, to be concatenated: a
/// vocabulary state can be larger than a gRPC client takes in one message.
pub const STATE_CHUNK_BYTES: usize = 1 << 20;

/// A step larger than this is cut into messages of about this size; smaller steps go as one
/// message. It stays under the 4 MiB that gRPC clients accept by default (tonic, grpc-java,
/// grpc-go), with room for the IPC header and the metadata.
pub const MESSAGE_TARGET_BYTES: usize = (4 << 20) - (256 << 10);

/// What every call but the handshake is told before a server's pipelines are given
/// ([`FlightServer::starting`]).
const STARTING: &str = "the server is starting (fitting its state, or waiting for the other \
                        processes of its cluster to join): retry shortly";

/// The pipelines a server started with [`FlightServer::starting`] serves, given once they
/// are ready.
#[derive(Clone, Default)]
pub struct Ready(Arc<std::sync::OnceLock<Vec<Arc<dyn Served>>>>);

impl Ready {
    /// Serves `pipelines` from now on (a second call is ignored).
    pub fn serve(&self, pipelines: Vec<Arc<dyn Served>>) {
        let _ = self.0.set(pipelines);
    }
}

/// The Flight service.
pub struct FlightServer {
    pipelines: Ready,
    auth: Option<Auth>,
    max_message_bytes: usize,
    tls: Option<ServerTlsConfig>,
    /// Where pushed batches take turns (`intake.rs`).
    intake: Intake,
}

impl FlightServer {
    /// Serves `pipelines`; with `auth`, every call but the handshake needs its token.
    /// Incoming messages may be up to `max_message_bytes`.
    pub fn new(
        pipelines: Vec<Arc<dyn Served>>,
        auth: Option<Auth>,
        max_message_bytes: usize,
    ) -> Self {
        let (server, ready) = FlightServer::starting(auth, max_message_bytes);
        ready.serve(pipelines);
        server
    }

    /// A server whose pipelines are given later, through the [`Ready`] returned with it:
    /// it can listen while they are prepared (a state fitted, a cluster joined), answering
    /// handshakes, and every other call UNAVAILABLE with the reason, rather than leave
    /// clients waiting on a port no one answers.
    pub fn starting(auth: Option<Auth>, max_message_bytes: usize) -> (Self, Ready) {
        let ready = Ready::default();
        let server = FlightServer {
            pipelines: ready.clone(),
            auth,
            max_message_bytes,
            tls: None,
            intake: Intake::new(PUSHES_HELD),
        };
        (server, ready)
    }

    /// The pipelines served, once they are given.
    fn pipelines(&self) -> Result<&[Arc<dyn Served>], Status> {
        self.pipelines
            .0
            .get()
            .map(Vec::as_slice)
            .ok_or_else(|| Status::unavailable(STARTING))
    }

    /// Serves over TLS (rustls) with this PEM certificate chain and private key; errs,
    /// saying why, if they cannot be used.
    pub fn with_tls(mut self, cert_pem: &[u8], key_pem: &[u8]) -> Result<Self, String> {
        self.tls = Some(identity(cert_pem, key_pem)?);
        Ok(self)
    }

    /// Serves on `listener` until `shutdown` resolves, then lets in-flight calls finish.
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), tonic::transport::Error> {
        let (max, tls) = (self.max_message_bytes, self.tls.clone());
        let server = Arc::new(self);
        let generated = FlightServiceServer::from_arc(server.clone())
            .max_decoding_message_size(max)
            .max_encoding_message_size(max.max(2 * MESSAGE_TARGET_BYTES));
        let service = Route::new(server, generated);
        let mut builder = tonic::transport::Server::builder();
        if let Some(tls) = tls {
            builder = builder.tls_config(tls)?;
        }
        builder
            // A dead peer's streams are dropped (and their runs let go) within a minute,
            // not when TCP gives up.
            .http2_keepalive_interval(Some(std::time::Duration::from_secs(30)))
            .http2_keepalive_timeout(Some(std::time::Duration::from_secs(20)))
            // Each open stream holds memory (~8 KB): without a bound one connection could
            // open streams until the host runs out (400k streams held 3.2 GB).
            .max_concurrent_streams(Some(MAX_STREAMS_PER_CONNECTION))
            // What a producer may send ahead of what the server has read (its receive
            // windows; a rank's stream is bounded by the trainer's). A push waiting for
            // its turn (`intake.rs`) holds that much here.
            .initial_stream_window_size(Some(RECEIVE_WINDOW))
            .initial_connection_window_size(Some(4 * RECEIVE_WINDOW))
            .add_service(service)
            .serve_with_incoming_shutdown(
                // A connection that never starts talking is dropped (`idle.rs`).
                TcpIncoming::from(listener)
                    .with_nodelay(Some(true))
                    .map_ok(|io| {
                        local::fit_send_buffer(&io);
                        FirstWords::new(io, GREETING_TIMEOUT)
                    })
                    // A failed accept (out of file descriptors, most often) leaves the
                    // connection waiting, so the next accept fails at once: tonic, which
                    // skips the error, spun both cores doing that. Pausing before the next
                    // one lets connections close meanwhile.
                    .then(|accepted| async move {
                        if accepted.is_err() {
                            tokio::time::sleep(ACCEPT_PAUSE).await;
                        }
                        accepted
                    }),
                shutdown,
            )
            .await
    }

    /// Whether the call carries a live token whose user has `role` (always, without auth).
    fn check<T>(&self, request: &Request<T>, role: Role) -> Result<(), Status> {
        self.check_token(header(request), Some(role))
    }

    /// Whether `token` (the `authorization` header) is live and its user has `role` (any
    /// user, for `None`).
    pub(crate) fn check_token(
        &self,
        token: Option<&str>,
        role: Option<Role>,
    ) -> Result<(), Status> {
        match &self.auth {
            None => Ok(()),
            Some(auth) => auth.check(token, role).map_err(denied),
        }
    }

    /// The messages of the rank stream a DoGet `ticket` asks for, checked.
    pub(crate) fn open_rank(&self, ticket: &[u8]) -> Result<Encoder, Status> {
        let (p, t) = self.admit(ticket)?;
        let batches = p.open(t.rank, t.epoch, t.start_step)?;
        let end = BatchMeta {
            epoch: t.epoch,
            step: t.start_step,
            rank: t.rank,
            rows: 0,
            padded_rows: 0,
            state_version: p.state_version(),
            positions: None,
            last: true,
            job: p.job(),
        };
        Ok(Encoder::new(p.schema(), batches, end))
    }

    fn pipeline(&self, name: &str) -> Result<&Arc<dyn Served>, Status> {
        self.pipelines()?
            .iter()
            .find(|p| p.name() == name)
            .ok_or_else(|| {
                Status::not_found(format!(
                    "no pipeline `{}` is served",
                    hydrant_operators::quoted(name)
                ))
            })
    }

    fn info(&self, p: &Arc<dyn Served>) -> Result<FlightInfo, Status> {
        let mut info = FlightInfo::new()
            .try_with_schema(&p.schema())
            .map_err(|e| Status::internal(e.to_string()))?
            .with_descriptor(FlightDescriptor::new_path(vec![p.name().to_string()]));
        for rank in 0..p.world_size() {
            let ticket = Ticket {
                pipeline: p.name().to_string(),
                epoch: 0,
                rank,
                world_size: p.world_size(),
                start_step: 0,
                job: None,
            };
            let mut endpoint =
                FlightEndpoint::new().with_ticket(arrow_flight::Ticket::new(ticket.to_bytes()));
            if let Some(location) = p.location(rank) {
                endpoint = endpoint.with_location(location);
            }
            info = info.with_endpoint(endpoint);
        }
        Ok(info)
    }

    fn descriptor_pipeline(&self, d: &FlightDescriptor) -> Result<&Arc<dyn Served>, Status> {
        match d.path.as_slice() {
            [name] => self.pipeline(name),
            _ => Err(Status::invalid_argument(
                "descriptor path must be [pipeline]",
            )),
        }
    }

    /// Checks a ticket against what is served.
    fn admit(&self, bytes: &[u8]) -> Result<(Arc<dyn Served>, Ticket), Status> {
        let t = Ticket::parse(bytes).map_err(|e| Status::invalid_argument(e.to_string()))?;
        let p = self.pipeline(&t.pipeline)?.clone();
        if t.world_size != p.world_size() {
            return Err(Status::invalid_argument(format!(
                "invalid ticket: `world_size` {} is not the served {}",
                t.world_size,
                p.world_size()
            )));
        }
        if t.epoch >= p.epochs() {
            return Err(Status::invalid_argument(format!(
                "invalid ticket: `epoch` {} is out of range (serving {} epochs)",
                t.epoch,
                p.epochs()
            )));
        }
        if let (Some(theirs), Some(ours)) = (t.job, p.job())
            && theirs != ours
        {
            return Err(Status::failed_precondition(format!(
                "this server serves another job of pipeline `{}` than the one this trainer \
                 read (job {ours:016x}, where the trainer's batches said {theirs:016x}): it \
                 was restarted with another input, state, --ranks, --batch-size, \
                 --last-batch, --shuffle, --shuffle-window or --seed, so the steps asked for \
                 would hold other rows. Restart it as before, or start the epoch over (a \
                 ticket without `job`)",
                p.name()
            )));
        }
        if t.start_step > p.steps() {
            return Err(Status::invalid_argument(format!(
                "invalid ticket: `start_step` {} is past the epoch's {} steps",
                t.start_step,
                p.steps()
            )));
        }
        Ok((p, t))
    }
}

fn denied(d: Denied) -> Status {
    match d {
        Denied::Unauthenticated(m) => Status::unauthenticated(m),
        Denied::PermissionDenied(m) => Status::permission_denied(m),
        Denied::Throttled(m) => Status::resource_exhausted(m),
    }
}

fn header<T>(request: &Request<T>) -> Option<&str> {
    request
        .metadata()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
}

/// Longest producer name a DoPut may give.
const MAX_PRODUCER_BYTES: usize = 200;

/// The HTTP/2 window a client may send into on each stream before the server reads it:
/// large enough to keep a push at full speed over loopback and a LAN, small enough that
/// producers waiting for their turn hold little each.
const RECEIVE_WINDOW: u32 = 2 << 20;

/// The origin of a batch pushed by `producer` (if it named itself) with `metadata`.
fn origin(producer: Option<&str>, metadata: &[u8]) -> Result<Option<Origin>, Status> {
    let Some(producer) = producer else {
        return Ok(None);
    };
    #[derive(Deserialize)]
    struct Seq {
        seq: u64,
    }
    let seq: Seq = serde_json::from_slice(metadata).map_err(|_| {
        Status::invalid_argument(format!(
            "producer `{}`: each batch's app_metadata must be {{\"seq\": N}}",
            hydrant_operators::quoted(producer)
        ))
    })?;
    // A producer's numbers only rise, so one that reached u64::MAX (a -1 cast, say) could
    // never push again under its name: numbers past i64::MAX (beyond any counter or
    // nanosecond clock, and the most a signed-integer client can send) are refused.
    if seq.seq > i64::MAX as u64 {
        return Err(Status::invalid_argument(format!(
            "producer `{}`: seq {} is past {}: number batches upward from a counter or a \
             clock, not from the top",
            hydrant_operators::quoted(producer),
            seq.seq,
            i64::MAX
        )));
    }
    Ok(Some(Origin {
        producer: producer.to_string(),
        seq: seq.seq,
    }))
}

/// A message over the decoding limit is RESOURCE_EXHAUSTED, whatever code tonic chose.
fn too_large(s: Status) -> Status {
    if s.message().contains("message length too large")
        || s.code() == tonic::Code::OutOfRange
        || s.code() == tonic::Code::ResourceExhausted
    {
        Status::resource_exhausted(format!("DoPut message too large: {}", s.message()))
    } else {
        s
    }
}

/// A tokio channel as a stream.
struct Rx<T>(tokio::sync::mpsc::Receiver<T>);

impl<T> Stream for Rx<T> {
    type Item = T;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        self.0.poll_recv(cx)
    }
}

type Boxed<T> = BoxStream<'static, Result<T, Status>>;

#[tonic::async_trait]
impl FlightService for FlightServer {
    type HandshakeStream = Boxed<HandshakeResponse>;
    type ListFlightsStream = Boxed<FlightInfo>;
    type DoGetStream = Pin<Box<dyn Stream<Item = Result<FlightData, Status>> + Send>>;
    type DoPutStream = Boxed<PutResult>;
    type DoExchangeStream = Boxed<FlightData>;
    type DoActionStream = Boxed<arrow_flight::Result>;
    type ListActionsStream = Boxed<ActionType>;

    async fn handshake(
        &self,
        request: Request<Streaming<HandshakeRequest>>,
    ) -> Result<Response<Self::HandshakeStream>, Status> {
        let reply = HandshakeResponse {
            protocol_version: 0,
            payload: Bytes::new(),
        };
        let Some(auth) = &self.auth else {
            return Ok(Response::new(Box::pin(stream::iter([Ok(reply)]))));
        };
        let peer = request.remote_addr().map(|a| a.ip());
        let bearer = match auth.handshake(header(&request), peer) {
            Ok(b) => b,
            Err(d) => {
                // Slows a guesser down on every connection; the per-peer count stops one
                // that opens many.
                tokio::time::sleep(FAILED_LOGIN_DELAY).await;
                return Err(denied(d));
            }
        };
        let mut response =
            Response::new(Box::pin(stream::iter([Ok(reply)])) as Self::HandshakeStream);
        let value = bearer
            .parse()
            .map_err(|_| Status::internal("bearer token is not a header value"))?;
        response.metadata_mut().insert("authorization", value);
        Ok(response)
    }

    async fn list_flights(
        &self,
        request: Request<Criteria>,
    ) -> Result<Response<Self::ListFlightsStream>, Status> {
        self.check(&request, Role::Train)?;
        let infos: Vec<_> = self.pipelines()?.iter().map(|p| self.info(p)).collect();
        Ok(Response::new(Box::pin(stream::iter(infos))))
    }

    async fn get_flight_info(
        &self,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        self.check(&request, Role::Train)?;
        let p = self.descriptor_pipeline(request.get_ref())?;
        Ok(Response::new(self.info(p)?))
    }

    async fn poll_flight_info(
        &self,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<PollInfo>, Status> {
        // As an unknown action: what the server cannot do is told to its users only.
        self.check_token(header(&request), None)?;
        Err(Status::unimplemented("PollFlightInfo: use GetFlightInfo"))
    }

    async fn get_schema(
        &self,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<SchemaResult>, Status> {
        self.check(&request, Role::Train)?;
        let p = self.descriptor_pipeline(request.get_ref())?;
        let options = IpcWriteOptions::default();
        let result = SchemaAsIpc::new(&p.schema(), &options)
            .try_into()
            .map_err(|e: arrow::error::ArrowError| Status::internal(e.to_string()))?;
        Ok(Response::new(result))
    }

    /// Served by [`FlightServer::serve`]'s own route, which sends the same messages without
    /// copying them; this is for a caller that mounts the generated service itself.
    async fn do_get(
        &self,
        request: Request<arrow_flight::Ticket>,
    ) -> Result<Response<Self::DoGetStream>, Status> {
        self.check(&request, Role::Train)?;
        let encoder = self.open_rank(&request.get_ref().ticket)?;
        Ok(Response::new(Box::pin(
            encoder.map_ok(crate::encode::Message::into_flight_data),
        )))
    }

    async fn do_put(
        &self,
        request: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoPutStream>, Status> {
        self.check(&request, Role::Ingest)?;
        let mut input = request.into_inner();
        let (first, place) = self.intake.next(&mut input).await;
        let first = first
            .map_err(|_| Status::invalid_argument("bad DoPut stream: it could not be read"))?
            .transpose()
            .map_err(too_large)?
            .ok_or_else(|| Status::invalid_argument("DoPut stream is empty"))?;
        drop(place);
        let (pipeline, producer) = match first.flight_descriptor.as_ref().map(|d| d.path.as_slice())
        {
            Some([ingest, name]) if ingest == "ingest" => (self.pipeline(name)?.clone(), None),
            Some([ingest, name, producer]) if ingest == "ingest" && !producer.is_empty() => {
                (self.pipeline(name)?.clone(), Some(producer.clone()))
            }
            _ => {
                return Err(Status::invalid_argument(
                    "DoPut descriptor path must be [\"ingest\", pipeline] or [\"ingest\", \
                         pipeline, producer]",
                ));
            }
        };
        pipeline.takes_pushes()?;
        if producer
            .as_ref()
            .is_some_and(|p| p.len() > MAX_PRODUCER_BYTES)
        {
            return Err(Status::invalid_argument(format!(
                "a producer name is at most {MAX_PRODUCER_BYTES} bytes"
            )));
        }
        let messages = stream::once(async { Ok(first) })
            .chain(input)
            .map(|m| {
                let m = m.map_err(too_large)?;
                crate::check::check_message(&m)
                    .map_err(|e| Status::invalid_argument(format!("bad DoPut message: {e}")))?;
                Ok(m)
            })
            .map_err(|s| arrow_flight::error::FlightError::Tonic(Box::new(s)));
        // Boxed: a trait object's `next` is one type whatever the lifetimes (the intake
        // polls it from a generic function inside a spawned task).
        let mut batches: BoxStream<'static, _> =
            Box::pin(FlightDataDecoder::new(messages).filter_map(|d| async move {
                match d {
                    Ok(DecodedFlightData {
                        inner,
                        payload: DecodedPayload::RecordBatch(batch),
                    }) => Some(Ok((batch, inner.app_metadata))),
                    Ok(_) => None,
                    Err(e) => Some(Err(e)),
                }
            }));
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let intake = self.intake.clone();
        tokio::spawn(async move {
            loop {
                // Messages are checked before arrow decodes them; should its decoder still
                // panic, the producer gets an error, never a stream that ends OK without
                // acknowledgements. The place is kept until the batch is admitted.
                let (next, _place) = intake.next(&mut batches).await;
                let batch = match next {
                    Ok(Some(batch)) => batch,
                    Ok(None) => return,
                    Err(_) => {
                        let status = Status::invalid_argument(
                            "bad DoPut stream: the IPC decoder failed on it",
                        );
                        let _ = tx.send(Err(status)).await;
                        return;
                    }
                };
                let (batch, metadata) = match batch {
                    Ok(b) => b,
                    Err(e) => {
                        let status = match e {
                            arrow_flight::error::FlightError::Tonic(s) => *s,
                            other => Status::invalid_argument(format!("bad DoPut stream: {other}")),
                        };
                        let _ = tx.send(Err(status)).await;
                        return;
                    }
                };
                let origin = match origin(producer.as_deref(), &metadata) {
                    Ok(o) => o,
                    Err(status) => {
                        let _ = tx.send(Err(status)).await;
                        return;
                    }
                };
                let p = pipeline.clone();
                let accepted = tokio::task::spawn_blocking(move || p.accept(batch, origin))
                    .await
                    .unwrap_or_else(|e| Err(ServeError::Internal(e.to_string())));
                let reply = accepted.map_err(Status::from).map(|a| {
                    let ack = match a.seq {
                        Some(seq) => serde_json::json!({"seq": seq, "rows": a.rows}),
                        None => serde_json::json!({"rows": a.rows, "duplicate": true}),
                    };
                    PutResult {
                        app_metadata: Bytes::from(serde_json::to_vec(&ack).unwrap_or_default()),
                    }
                });
                let failed = reply.is_err();
                if tx.send(reply).await.is_err() || failed {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(Rx(rx))))
    }

    async fn do_exchange(
        &self,
        request: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoExchangeStream>, Status> {
        self.check(&request, Role::Ingest)?;
        Err(Status::unimplemented("DoExchange is not served"))
    }

    async fn do_action(
        &self,
        request: Request<Action>,
    ) -> Result<Response<Self::DoActionStream>, Status> {
        // The actions that operate the server need `admin`; trainers commit their
        // checkpoints and read states (`train`). Each arm checks its own role, so an
        // action added without one cannot be open to every user; an unknown one is
        // UNIMPLEMENTED to any authenticated user.
        let token = header(&request);
        match request.get_ref().r#type.as_str() {
            "status" => {
                self.check_token(token, Some(Role::Admin))?;
                let status = serde_json::json!({
                    "pipelines": self.pipelines()?.iter().map(|p| p.status()).collect::<Vec<_>>(),
                });
                let body =
                    arrow_flight::Result::new(serde_json::to_vec(&status).unwrap_or_default());
                Ok(Response::new(Box::pin(stream::iter([Ok(body)]))))
            }
            "end_ingest" => {
                self.check_token(token, Some(Role::Admin))?;
                let name = end_ingest_pipeline(&request.get_ref().body)?;
                let p = self.pipeline(&name)?.clone();
                tokio::task::spawn_blocking(move || p.end_input())
                    .await
                    .map_err(|e| Status::internal(e.to_string()))??;
                let body = arrow_flight::Result::new(b"{\"ended\":true}".to_vec());
                Ok(Response::new(Box::pin(stream::iter([Ok(body)]))))
            }
            "commit" => {
                self.check_token(token, Some(Role::Train))?;
                let req: CommitRequest =
                    crate::json::from_json(&request.get_ref().body).map_err(|e| {
                        Status::invalid_argument(format!(
                            "commit: body must be JSON {{\"pipeline\": NAME, \"step\": N}}: {e}"
                        ))
                    })?;
                let p = self.pipeline(&req.pipeline)?.clone();
                if let Some(mut cut) = p.steps_cut() {
                    // Answered by `commit` either way: a step still not given is refused.
                    let given = cut.wait_for(|&cut| cut >= req.step);
                    let _ = tokio::time::timeout(COMMIT_WAIT, given).await;
                }
                let reply = tokio::task::spawn_blocking(move || p.commit(req.step))
                    .await
                    .map_err(|e| Status::internal(e.to_string()))??;
                let body =
                    arrow_flight::Result::new(serde_json::to_vec(&reply).unwrap_or_default());
                Ok(Response::new(Box::pin(stream::iter([Ok(body)]))))
            }
            "state" => {
                self.check_token(token, Some(Role::Train))?;
                let req: StateRequest =
                    crate::json::from_json(&request.get_ref().body).map_err(|e| {
                        Status::invalid_argument(format!(
                            "state: body must be JSON {{\"pipeline\": NAME, \"version\": V}}: {e}"
                        ))
                    })?;
                let p = self.pipeline(&req.pipeline)?.clone();
                let json = tokio::task::spawn_blocking(move || p.state(req.version))
                    .await
                    .map_err(|e| Status::internal(e.to_string()))??;
                let chunks: Vec<_> = json
                    .as_bytes()
                    .chunks(STATE_CHUNK_BYTES)
                    .map(|c| Ok(arrow_flight::Result::new(Bytes::copy_from_slice(c))))
                    .collect();
                Ok(Response::new(Box::pin(stream::iter(chunks))))
            }
            other => {
                self.check_token(token, None)?;
                Err(Status::unimplemented(format!(
                    "unknown action `{}` (ListActions lists them)",
                    hydrant_operators::quoted(other)
                )))
            }
        }
    }

    async fn list_actions(
        &self,
        request: Request<Empty>,
    ) -> Result<Response<Self::ListActionsStream>, Status> {
        // What the server can do is no secret from any of its users.
        self.check_token(header(&request), None)?;
        let actions = [
            (
                "status",
                "JSON: each pipeline's ranks, steps served and queue depths",
            ),
            (
                "end_ingest",
                "body: a pipeline name; closes its pushed input",
            ),
            (
                "commit",
                "body: {\"pipeline\": NAME, \"step\": S}; the trainers' checkpoint holds \
                 every step before S: a restarted server resumes there (pushed input)",
            ),
            (
                "state",
                "body: {\"pipeline\": NAME, \"version\": V}; the fitted state whose version \
                 batches carry as state_version, as JSON in results to concatenate",
            ),
        ]
        .map(|(t, d)| {
            Ok(ActionType {
                r#type: t.into(),
                description: d.into(),
            })
        });
        Ok(Response::new(Box::pin(stream::iter(actions))))
    }
}

/// The pipeline an `end_ingest` body names: the name itself, or JSON `{"pipeline": NAME}`
/// as the other actions take (a name never starts with `{`).
fn end_ingest_pipeline(body: &[u8]) -> Result<String, Status> {
    let bad = || {
        Status::invalid_argument(
            "end_ingest: body must be the pipeline name, or JSON {\"pipeline\": NAME}",
        )
    };
    let text = std::str::from_utf8(body).map_err(|_| bad())?;
    if !text.trim_start().starts_with('{') {
        return Ok(text.to_string());
    }
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Body {
        pipeline: String,
    }
    serde_json::from_str::<Body>(text)
        .map(|b| b.pipeline)
        .map_err(|_| bad())
}
