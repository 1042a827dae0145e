//! A client for `hydrant serve`: Basic-then-bearer authentication, the pipeline's schema
//! and tickets, and each rank's stream as one [`StepBatch`] per step — a step sent as
//! several messages is reassembled, and a stream that breaks the contract (a gap, a step
//! cut short, an end without `last`) is an error that says where to resume.

use std::time::Duration;

use arrow::array::RecordBatch;
use arrow::compute::concat_batches;
use arrow::datatypes::Schema;
use arrow_flight::decode::{DecodedPayload, FlightDataDecoder};
use arrow_flight::error::FlightError;
use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::{FlightClient, FlightDescriptor, HandshakeRequest};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use futures::{Stream, StreamExt};
use hydrant_operators::quoted;

use crate::served::BatchMeta;
use crate::ticket::Ticket;

/// The largest message the client accepts (the server cuts a step into messages of under
/// 4 MiB, but one row larger than that still comes whole).
pub const MAX_MESSAGE_BYTES: usize = 256 << 20;

/// Why a call failed or a stream broke its contract.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server could not be reached.
    #[error("cannot connect to {uri}: {reason}")]
    Connect {
        /// The server's address.
        uri: String,
        /// Why.
        reason: String,
    },
    /// The server answered with an error status.
    #[error("{:?}: {}", .0.code(), .0.message())]
    Status(#[from] tonic::Status),
    /// The stream broke hydrant's contract, or a reply could not be read.
    #[error("{0}")]
    Protocol(String),
}

impl From<FlightError> for ClientError {
    fn from(e: FlightError) -> Self {
        match e {
            FlightError::Tonic(status) => ClientError::Status(*status),
            other => ClientError::Protocol(other.to_string()),
        }
    }
}

/// One rank's batch of one step, exactly `rows` rows.
#[derive(Debug, Clone)]
pub struct StepBatch {
    /// The step's metadata, as the server sent it.
    pub meta: BatchMeta,
    /// The rows (one message's buffers, or one copy joining several).
    pub batch: RecordBatch,
}

/// How long a call may go without a word from the server before the client pings it, and
/// how long it then waits for the answer: a server that stops answering (a frozen
/// process, a network that drops everything) fails the call within twice this, rather
/// than leave a trainer waiting forever. A server that is only slow answers the pings.
/// The answers are read by the connection's task, so a caller's runtime should keep it
/// running between steps (a runtime with a worker thread does); on a current-thread
/// runtime it runs only inside `block_on`. (A cut of a live stream that way was not
/// seen: hydrant's remote reader kept its stream through a 58 s pause either way.)
pub const KEEPALIVE: Duration = Duration::from_secs(30);

/// How [`Client::connect_with`] connects.
#[derive(Debug, Clone)]
pub struct Connect {
    /// The certificate authority (PEM) to trust for a TLS server (`grpc+tls://`).
    pub ca_pem: Option<Vec<u8>>,
    /// See [`KEEPALIVE`], the default; `None` sends no pings.
    pub keepalive: Option<Duration>,
}

impl Default for Connect {
    fn default() -> Self {
        Connect {
            ca_pem: None,
            keepalive: Some(KEEPALIVE),
        }
    }
}

/// `$call` (a future of a `Result<_, FlightError>`, made from `$c`, the client's
/// `FlightClient`), made once more after a new login when it was refused as
/// UNAUTHENTICATED ([`Client::logged_in_again`]).
macro_rules! retried {
    ($client:expr, $c:ident => $call:expr) => {{
        let $c = &mut $client.inner;
        let mut result = $call.await;
        if $client.logged_in_again(unauthenticated(&result)).await? {
            let $c = &mut $client.inner;
            result = $call.await;
        }
        result
    }};
}

/// Whether `result` is the server's refusal of the client's token.
fn unauthenticated<T>(result: &Result<T, FlightError>) -> bool {
    matches!(result, Err(FlightError::Tonic(status)) if status.code() == tonic::Code::Unauthenticated)
}

/// A connection to `hydrant serve`.
pub struct Client {
    inner: FlightClient,
    /// The credentials of the last [`Client::authenticate`]: a call refused as
    /// UNAUTHENTICATED (a token expired, or a server restarted) logs in with them again.
    login: Option<(String, String)>,
}

impl Client {
    /// Connects to `uri` (`http://host:port`, or `grpc://host:port` as pyarrow writes it).
    /// A TLS server (`grpc+tls://`, `https://`) needs [`Client::connect_tls`].
    pub async fn connect(uri: &str) -> Result<Self, ClientError> {
        Self::connect_with(uri, &Connect::default()).await
    }

    /// Connects over TLS to `uri` (`grpc+tls://host:port` or `https://host:port`),
    /// trusting the certificate authority `ca_pem` (PEM).
    pub async fn connect_tls(uri: &str, ca_pem: &[u8]) -> Result<Self, ClientError> {
        let how = Connect {
            ca_pem: Some(ca_pem.to_vec()),
            ..Connect::default()
        };
        Self::connect_with(uri, &how).await
    }

    /// Connects to `uri` as `how` says (TLS trust, keep-alive).
    pub async fn connect_with(uri: &str, how: &Connect) -> Result<Self, ClientError> {
        let ca_pem = how.ca_pem.as_deref();
        let fail = |reason: String| ClientError::Connect {
            uri: uri.to_string(),
            reason,
        };
        let (scheme, rest) = uri
            .split_once("://")
            .ok_or_else(|| fail("expected scheme://host:port".into()))?;
        let tls = match scheme {
            "http" | "grpc" | "grpc+tcp" => false,
            "https" | "grpc+tls" => true,
            other => return Err(fail(format!("unknown scheme `{}`", quoted(other)))),
        };
        let mut endpoint = tonic::transport::Endpoint::from_shared(format!(
            "{}://{rest}",
            if tls { "https" } else { "http" }
        ))
        .map_err(|e| fail(e.to_string()))?;
        match (tls, ca_pem) {
            (true, Some(ca)) => {
                let config = tonic::transport::ClientTlsConfig::new()
                    .ca_certificate(tonic::transport::Certificate::from_pem(ca));
                endpoint = endpoint.tls_config(config).map_err(|e| fail(chain(&e)))?;
            }
            (true, None) => {
                return Err(fail(
                    "a TLS server: connect with Client::connect_tls and its CA".into(),
                ));
            }
            (false, Some(_)) => {
                return Err(fail(
                    "a CA was given for a plaintext uri (use grpc+tls://)".into(),
                ));
            }
            (false, None) => {}
        }
        if how.keepalive.is_some_and(|every| every.is_zero()) {
            return Err(fail("keepalive must be longer than zero (or None)".into()));
        }
        if let Some(every) = how.keepalive {
            endpoint = endpoint
                .http2_keep_alive_interval(every)
                .keep_alive_timeout(every);
        }
        let channel = endpoint
            .tcp_nodelay(true)
            // A rank's stream is a bulk transfer: large windows, as the server uses.
            .initial_stream_window_size(Some(16 << 20))
            .initial_connection_window_size(Some(64 << 20))
            .connect()
            .await
            .map_err(|e| fail(chain(&e)))?;
        Ok(Self::from_channel(channel))
    }

    /// A client on a channel the caller configured (its timeouts, keep-alive, flow-control
    /// windows; [`Client::connect`] opens 16 MiB stream windows, as the server does).
    pub fn from_channel(channel: tonic::transport::Channel) -> Self {
        let inner = FlightServiceClient::new(channel).max_decoding_message_size(MAX_MESSAGE_BYTES);
        Client {
            inner: FlightClient::new_from_inner(inner),
            login: None,
        }
    }

    /// Authenticates against a server started with `--token-file`: Basic credentials in the
    /// Handshake, then the bearer token it returns on every later call. A call the server
    /// later refuses as UNAUTHENTICATED (the token expired after `--token-ttl`, or the
    /// server restarted and knows none it gave before) logs in again once and is retried.
    pub async fn authenticate(&mut self, user: &str, password: &str) -> Result<(), ClientError> {
        self.login = Some((user.to_string(), password.to_string()));
        self.handshake(user, password).await
    }

    async fn handshake(&mut self, user: &str, password: &str) -> Result<(), ClientError> {
        let basic = format!("Basic {}", STANDARD.encode(format!("{user}:{password}")));
        let mut request = tonic::Request::new(futures::stream::iter([HandshakeRequest::default()]));
        let value = basic
            .parse()
            .map_err(|_| ClientError::Protocol("credentials are not a valid header".into()))?;
        request.metadata_mut().insert("authorization", value);
        let response = self.inner.inner_mut().handshake(request).await?;
        let bearer = response
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| ClientError::Protocol("the handshake returned no token".into()))?
            .to_string();
        self.inner.add_header("authorization", &bearer)?;
        Ok(())
    }

    /// Whether this client, whose token was `refused`, has logged in again, so that the
    /// call is worth making once more.
    async fn logged_in_again(&mut self, refused: bool) -> Result<bool, ClientError> {
        let Some((user, password)) = self.login.clone().filter(|_| refused) else {
            return Ok(false);
        };
        self.handshake(&user, &password).await?;
        Ok(true)
    }

    /// The schema of `pipeline`'s batches.
    pub async fn schema(&mut self, pipeline: &str) -> Result<Schema, ClientError> {
        let descriptor = FlightDescriptor::new_path(vec![pipeline.to_string()]);
        Ok(retried!(self, c => c.get_schema(descriptor.clone()))?)
    }

    /// The tickets of every rank of `pipeline` (epoch 0), in rank order.
    pub async fn tickets(&mut self, pipeline: &str) -> Result<Vec<Ticket>, ClientError> {
        Ok(self
            .endpoints(pipeline)
            .await?
            .into_iter()
            .map(|(ticket, _)| ticket)
            .collect())
    }

    /// Every rank's ticket (epoch 0) and, when another server serves the rank (a process
    /// of the same cluster), that server's location (`grpc://HOST:PORT`), in rank order.
    pub async fn endpoints(
        &mut self,
        pipeline: &str,
    ) -> Result<Vec<(Ticket, Option<String>)>, ClientError> {
        let descriptor = FlightDescriptor::new_path(vec![pipeline.to_string()]);
        let info = retried!(self, c => c.get_flight_info(descriptor.clone()))?;
        info.endpoint
            .iter()
            .map(|e| {
                let bytes = e.ticket.as_ref().map(|t| t.ticket.as_ref()).unwrap_or(&[]);
                let ticket =
                    Ticket::parse(bytes).map_err(|e| ClientError::Protocol(e.to_string()))?;
                Ok((ticket, e.location.first().map(|l| l.uri.clone())))
            })
            .collect()
    }

    /// The server's `status` action: JSON about each pipeline and its runs.
    pub async fn status(&mut self) -> Result<serde_json::Value, ClientError> {
        use futures::TryStreamExt;
        let action = arrow_flight::Action::new("status", Bytes::new());
        let replies: Vec<Bytes> = retried!(self, c => async {
            c.do_action(action.clone()).await?.try_collect().await
        })?;
        let reply = replies
            .first()
            .ok_or_else(|| ClientError::Protocol("the status action returned nothing".into()))?;
        serde_json::from_slice(reply).map_err(|e| ClientError::Protocol(format!("status: {e}")))
    }

    /// The `commit` action: the trainers' checkpoint holds every step of `pipeline`
    /// before `step`, so a restarted server resumes there. Returns the server's reply
    /// (`{"committed", "durable", "deleted_segments"}`).
    pub async fn commit(
        &mut self,
        pipeline: &str,
        step: u64,
    ) -> Result<serde_json::Value, ClientError> {
        use futures::TryStreamExt;
        let body = serde_json::json!({"pipeline": pipeline, "step": step});
        let action = arrow_flight::Action::new("commit", Bytes::from(body.to_string()));
        let replies: Vec<Bytes> = retried!(self, c => async {
            c.do_action(action.clone()).await?.try_collect().await
        })?;
        let reply = replies
            .first()
            .ok_or_else(|| ClientError::Protocol("the commit action returned nothing".into()))?;
        serde_json::from_slice(reply).map_err(|e| ClientError::Protocol(format!("commit: {e}")))
    }

    /// The `state` action: the fitted state of `pipeline` whose version batches carry as
    /// `state_version`, as JSON (a refreshed stream makes new versions as rows arrive).
    pub async fn state(&mut self, pipeline: &str, version: u64) -> Result<String, ClientError> {
        use futures::TryStreamExt;
        let body = serde_json::json!({"pipeline": pipeline, "version": version});
        let action = arrow_flight::Action::new("state", Bytes::from(body.to_string()));
        let replies: Vec<Bytes> = retried!(self, c => async {
            c.do_action(action.clone()).await?.try_collect().await
        })?;
        String::from_utf8(replies.concat())
            .map_err(|e| ClientError::Protocol(format!("state: {e}")))
    }

    /// The stream a ticket names, one [`StepBatch`] per step.
    pub async fn steps(&mut self, ticket: &Ticket) -> Result<Steps, ClientError> {
        let t = arrow_flight::Ticket::new(ticket.to_bytes());
        let stream = retried!(self, c => c.do_get(t.clone()))?;
        Ok(Steps {
            decoder: stream.into_inner(),
            rank: ticket.rank,
            next: ticket.start_step,
            parts: Vec::new(),
            meta: None,
            have: 0,
            done: false,
        })
    }
}

/// One rank's stream, reassembled into steps.
pub struct Steps {
    decoder: FlightDataDecoder,
    rank: u32,
    /// The step the stream owes next.
    next: u64,
    parts: Vec<RecordBatch>,
    meta: Option<BatchMeta>,
    have: u64,
    done: bool,
}

impl Steps {
    /// The next step; `None` after the epoch's last one. An error ends the stream.
    pub async fn next_step(&mut self) -> Option<Result<StepBatch, ClientError>> {
        if self.done {
            return None;
        }
        let got = self.step().await;
        if !matches!(got, Some(Ok(_))) {
            self.done = true;
        }
        got
    }

    /// The steps as a `Stream`.
    pub fn into_stream(self) -> impl Stream<Item = Result<StepBatch, ClientError>> + Send {
        futures::stream::unfold(
            self,
            |mut s| async move { s.next_step().await.map(|r| (r, s)) },
        )
    }

    fn broken(&self, what: String) -> Option<Result<StepBatch, ClientError>> {
        Some(Err(ClientError::Protocol(format!(
            "rank {}: {what}; resume with start_step {}",
            self.rank, self.next
        ))))
    }

    async fn step(&mut self) -> Option<Result<StepBatch, ClientError>> {
        loop {
            let message = match self.decoder.next().await {
                Some(Ok(m)) => m,
                Some(Err(e)) => return Some(Err(e.into())),
                None if self.parts.is_empty() => {
                    return self.broken(format!(
                        "the stream ended before step {} without the epoch's last message \
                         (a cut, not the end of the epoch)",
                        self.next
                    ));
                }
                None => return self.broken(format!("the stream ended inside step {}", self.next)),
            };
            let meta = match message.inner.app_metadata.is_empty() {
                true => None,
                false => match serde_json::from_slice::<BatchMeta>(&message.inner.app_metadata) {
                    Ok(m) => Some(m),
                    Err(e) => return self.broken(format!("unreadable batch metadata: {e}")),
                },
            };
            let batch = match message.payload {
                DecodedPayload::RecordBatch(b) => b,
                DecodedPayload::None | DecodedPayload::Schema(_) => continue,
            };
            // The end of an epoch whose last step was not known in advance: a batch of no
            // rows whose metadata says `rows` 0 and `last`.
            if let Some(m) = meta.filter(|m| batch.num_rows() == 0 && m.rows == 0) {
                if m.last && self.parts.is_empty() && m.step == self.next {
                    return None;
                }
                if m.last {
                    return self.broken(format!("the epoch ended at step {}", m.step));
                }
                continue;
            }
            let Some(meta) = meta else {
                return self.broken("a batch without metadata".into());
            };
            if self.parts.is_empty() {
                if meta.step != self.next {
                    return self.broken(format!("the server sent step {}", meta.step));
                }
                self.meta = Some(meta);
            } else if self.meta.is_some_and(|m| m.step != meta.step) {
                return self.broken(format!(
                    "step {} ended after {} of its rows",
                    self.next, self.have
                ));
            }
            self.have += batch.num_rows() as u64;
            self.parts.push(batch);
            let want = self.meta.map_or(0, |m| m.rows);
            if self.have < want {
                continue;
            }
            if self.have > want {
                return self.broken(format!(
                    "step {} has {} rows, not {want}",
                    self.next, self.have
                ));
            }
            let parts = std::mem::take(&mut self.parts);
            self.have = 0;
            let batch = match parts.len() {
                1 => parts.into_iter().next().expect("one part"),
                _ => match concat_batches(&parts[0].schema(), &parts) {
                    Ok(b) => b,
                    Err(e) => return self.broken(format!("cannot join step {}: {e}", self.next)),
                },
            };
            let meta = self.meta.take().expect("set with the first part");
            self.next += 1;
            if meta.last {
                self.done = true;
            }
            return Some(Ok(StepBatch { meta, batch }));
        }
    }
}

/// An error with its sources: tonic's transport errors say only "transport error" at the
/// top.
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}
