//! # hydrant-flight
//!
//! The Arrow Flight face of hydrant: a Flight service that serves each rank's stream of
//! training batches to remote trainers. It knows nothing of dataflows: a pipeline is
//! served through the [`Served`] trait, which the `hydrant` crate implements.
//!
//! - `ListFlights` / `GetFlightInfo` (descriptor path `[pipeline]`): the output schema and
//!   one endpoint per rank, in rank order, each with its ticket.
//! - `DoGet` with a JSON [`Ticket`]: that rank's batches of that epoch from `start_step`;
//!   every batch message carries [`BatchMeta`] JSON as `app_metadata`.
//! - `DoAction("status")`: JSON about each pipeline.
//! - With a token file, `Handshake` takes HTTP Basic credentials and answers with a bearer
//!   token that every other call must carry.
//!
//! [`Client`] is the other side: it reads a rank's stream as one [`StepBatch`] per step.
//!
//! ```
//! use hydrant_flight::Ticket;
//!
//! let t = Ticket::parse(br#"{"pipeline":"criteo","epoch":0,"rank":1,"world_size":2,"start_step":0}"#)?;
//! assert_eq!((t.rank, t.world_size), (1, 2));
//! assert!(Ticket::parse(br#"{"pipeline":"criteo","rank":2,"world_size":2}"#).is_err());
//! # Ok::<(), hydrant_flight::TicketError>(())
//! ```

mod auth;
mod check;
mod client;
mod doget;
mod encode;
mod idle;
mod intake;
mod json;
mod local;
mod served;
mod service;
mod ticket;
mod tls;

pub use auth::{Auth, AuthError, DEFAULT_TTL, Denied, FAILURE_WINDOW, MAX_FAILURES, MAX_TTL, Role};
pub use check::{
    Guarded, MAX_PUSH_ROWS, check_ipc_message, check_message, decode_guarded, decode_quietly,
    decoding, quiet_decoder_panics,
};
pub use client::{Client, ClientError, Connect, KEEPALIVE, MAX_MESSAGE_BYTES, StepBatch, Steps};
pub use encode::batch_bytes;
pub use served::{Accepted, BatchMeta, Origin, RankStream, ServeError, Served};
pub use service::{ACCEPT_PAUSE, COMMIT_WAIT, FlightServer, MAX_STREAMS_PER_CONNECTION, Ready};
pub use ticket::{Ticket, TicketError};
pub use tls::check_tls;
