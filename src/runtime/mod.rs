//! The runtime: the timely dataflow that reads, fits, featurizes and delivers — as threads
//! of one process or as the processes of a cluster — and what happens when part of it
//! fails (a worker panics, a peer process is lost).

mod agree;
mod cluster;
mod dataflow;
mod fate;
mod gather;
mod give_up;
mod handshake;
mod heartbeat;
mod held;
mod read;
mod stream;

pub use agree::{job_fingerprint, same_served};
pub use cluster::{Cluster, JOIN_TIMEOUT, Started};
pub use dataflow::{Channels, Job, OpenQueue, Output, RankQueue, Report, execute};
pub use gather::gather;
pub use give_up::GIVE_UP_WAIT;
pub use handshake::ClusterSecret;
pub use heartbeat::Signals;
pub use stream::{Delivering, PushedRows, StepsCut};
