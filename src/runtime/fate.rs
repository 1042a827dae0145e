//! What happens when a thread of the dataflow panics or a peer process is lost: the job
//! ends promptly with one line saying which, instead of hanging (timely's other workers
//! would wait for the dead one's progress forever) or printing a backtrace.
//!
//! A panic hook, installed once per process, sees every panic of a timely thread
//! (`timely:work-N`, and in a cluster `timely:send-N` / `timely:recv-N`, whose panics mean
//! process N is gone). A worker's panic is recorded in its job's [`Fate`] (each worker
//! thread registers its job's at start), and in the job's error slot, before the thread
//! unwinds: a rank queue that closes as it unwinds is never taken for a clean end. A lost
//! peer is recorded in the process-wide slot that every cluster job watches: by that
//! hook when timely's connection to it breaks, or by the job's heartbeats
//! (`heartbeat.rs`) when it stops answering without closing anything.
//! [`super::execute`] polls both and, once either is set, returns the error without
//! joining the workers, which may never finish.

use std::cell::RefCell;
use std::sync::{Arc, Once, OnceLock};

use hydrant_operators::ErrorSlot;

/// Where a job's first fatal failure (a panic in one of its workers) is recorded.
#[derive(Debug, Clone)]
pub struct Fate {
    failure: Arc<OnceLock<String>>,
    /// The job's error slot, which has the failure the moment it happens.
    errors: ErrorSlot,
}

impl Fate {
    /// The fate of a job whose errors go to `errors`.
    pub fn new(errors: ErrorSlot) -> Self {
        Fate {
            failure: Arc::default(),
            errors,
        }
    }

    /// The failure, if one happened.
    pub fn failure(&self) -> Option<&str> {
        self.failure.get().map(String::as_str)
    }

    /// Records `failure`, here and in the job's error slot, unless an earlier one is there.
    pub fn fail(&self, failure: String) {
        self.errors.set_message(&failure);
        let _ = self.failure.set(failure);
    }
}

thread_local! {
    /// The job whose worker runs on this thread.
    static JOB: RefCell<Option<Fate>> = const { RefCell::new(None) };
    /// Whether this thread is in [`quietly`].
    static QUIET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f`, turning a panic in it into `None` with nothing printed: for tearing down
/// timely's network threads, whose guard panics when a peer closed its connections first.
pub fn quietly<R>(f: impl FnOnce() -> R) -> Option<R> {
    install_hook();
    QUIET.with(|q| q.set(true));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).ok();
    QUIET.with(|q| q.set(false));
    result
}

/// The first lost peer of this process's cluster: `(process index, what was seen)`.
static LOST_PEER: OnceLock<(usize, String)> = OnceLock::new();

/// Marks this thread as a worker of the job with `fate`, installing the hook if needed.
pub fn register_worker(fate: &Fate) {
    install_hook();
    JOB.with(|j| *j.borrow_mut() = Some(fate.clone()));
}

/// Ends this worker thread (unwinding it, without the panic hook) if another worker of
/// its job failed. Workers call it wherever they wait on the others' progress, which a
/// dead worker never makes: the survivors would otherwise wait forever, holding the job's
/// queues open, so that a served run's streams never saw its end (nor its error).
pub fn abandon_if_failed() {
    let failed = JOB.with(|j| j.borrow().as_ref().is_some_and(|f| f.failure().is_some()));
    if failed {
        std::panic::resume_unwind(Box::new("another worker of the job failed"));
    }
}

/// The peer process whose connection broke first, if one did.
pub fn lost_peer() -> Option<&'static (usize, String)> {
    LOST_PEER.get()
}

/// Records that `peer` is lost (the first lost peer stays): what its heartbeat saw.
pub(super) fn lose_peer(peer: usize, seen: String) {
    let _ = LOST_PEER.set((peer, seen));
}

/// Installs the panic hook (once per process).
pub fn install_hook() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if QUIET.with(|q| q.get()) {
                return;
            }
            // A panic inside a guarded decoder becomes that read's error, not the job's.
            if hydrant_flight::decoding() {
                return previous(info);
            }
            let thread = std::thread::current();
            let name = thread.name().unwrap_or("");
            let Some(role) = name.strip_prefix("timely:") else {
                return previous(info);
            };
            let message = hydrant_operators::running::panic_message(info);
            let peer = role
                .strip_prefix("send-")
                .or_else(|| role.strip_prefix("recv-"))
                .and_then(|n| n.parse::<usize>().ok());
            if let Some(peer) = peer {
                let _ = LOST_PEER.set((peer, message.to_string()));
                return;
            }
            // A worker stopped by a lost peer ("MergeQueue poisoned") is not news.
            if LOST_PEER.get().is_some() {
                return;
            }
            let at = info
                .location()
                .map(|l| format!(" at {}:{}", l.file(), l.line()))
                .unwrap_or_default();
            let op = hydrant_operators::running::current()
                .map(|op| format!(" in operator `{op}`"))
                .unwrap_or_default();
            let recorded = JOB.with(|j| {
                j.borrow()
                    .as_ref()
                    .map(|fate| fate.fail(format!("{role} panicked{op}{at}: {message}")))
                    .is_some()
            });
            if !recorded {
                previous(info);
            }
        }));
    });
}
