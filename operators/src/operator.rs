//! The `featurize` timely operator: applies a [`Transformer`] to every batch of a stream.

use std::sync::{Arc, Mutex};

use timely::dataflow::StreamVec;
use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::generic::operator::Operator;
use timely::progress::Timestamp;

use crate::batch::Batch;
use crate::transform::Transformer;

/// Where an operator leaves the first error it meets, for the worker's loop to notice and
/// stop on: a dataflow has no other way to hand an error back to its caller. It keeps
/// where the error came from too ([`ErrorSlot::origin`]), so that a server can tell a
/// client whether its input, its cluster or itself failed.
#[derive(Debug, Clone, Default)]
pub struct ErrorSlot(Arc<Mutex<Option<Recorded>>>);

/// The first error of a slot and where it came from.
#[derive(Debug, Clone)]
struct Recorded {
    origin: Option<String>,
    message: String,
}

impl ErrorSlot {
    /// Records `error` (with the operator's name, which is its origin) unless an earlier
    /// one is there.
    pub fn set(&self, operator: &str, error: impl std::fmt::Display) {
        self.record(Some(operator), || format!("{operator}: {error}"));
    }

    /// Records `message` as it is (it names where it happened) unless an earlier one is
    /// there; its origin is unknown.
    pub fn set_message(&self, message: &str) {
        self.record(None, || message.to_string());
    }

    /// Records `message` as it is, as having come from `origin`, unless an earlier one
    /// is there.
    pub fn set_from(&self, origin: &str, message: &str) {
        self.record(Some(origin), || message.to_string());
    }

    fn record(&self, origin: Option<&str>, message: impl FnOnce() -> String) {
        let mut slot = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            *slot = Some(Recorded {
                origin: origin.map(str::to_string),
                message: message(),
            });
        }
    }

    /// The first error recorded, if any.
    pub fn get(&self) -> Option<String> {
        self.lock().as_ref().map(|r| r.message.clone())
    }

    /// Where the first error came from: the operator name it was [`set`](Self::set)
    /// with, or the origin given to [`set_from`](Self::set_from). `None` with no error,
    /// or one recorded by [`set_message`](Self::set_message).
    pub fn origin(&self) -> Option<String> {
        self.lock().as_ref().and_then(|r| r.origin.clone())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Recorded>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Featurizes a stream of raw batches, each into a new batch: for dataflows built on this
/// crate alone. (hydrant's own dataflow featurizes in its place operator, which writes a
/// shuffled batch's rows straight into their steps with [`Transformer::featurize_rows`].)
pub trait Featurize<'scope, T: Timestamp> {
    /// Applies `transformer` to each batch; a batch that fails is reported to `errors` and
    /// dropped, and the worker is expected to stop.
    fn featurize(self, transformer: Transformer, errors: ErrorSlot) -> StreamVec<'scope, T, Batch>;
}

impl<'scope, T: Timestamp> Featurize<'scope, T> for StreamVec<'scope, T, Batch> {
    fn featurize(
        self,
        mut transformer: Transformer,
        errors: ErrorSlot,
    ) -> StreamVec<'scope, T, Batch> {
        self.unary(Pipeline, "Featurize", move |_, _| {
            move |input, output| {
                let _running = crate::running::enter("featurize");
                input.for_each(|time, data| {
                    let mut session = output.session(&time);
                    for batch in data.drain(..) {
                        match transformer.apply(&batch.data) {
                            Ok(out) => session.give(Batch {
                                seq: batch.seq,
                                data: out,
                            }),
                            Err(e) => errors.set("featurize", e),
                        }
                    }
                });
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::ErrorSlot;

    /// The first error stays, with where it came from; a message set as it is has no
    /// origin unless one is given.
    #[test]
    fn a_slot_keeps_its_first_error_and_its_origin() {
        let slot = ErrorSlot::default();
        assert_eq!((slot.get(), slot.origin()), (None, None));
        slot.set_from("cluster", "lost process 1");
        slot.set("source", "later");
        assert_eq!(slot.get().as_deref(), Some("lost process 1"));
        assert_eq!(slot.origin().as_deref(), Some("cluster"));

        let slot = ErrorSlot::default();
        slot.set("source", "gone");
        assert_eq!(slot.get().as_deref(), Some("source: gone"));
        assert_eq!(slot.origin().as_deref(), Some("source"));

        let slot = ErrorSlot::default();
        slot.set_message("worker 1 panicked");
        assert_eq!(slot.origin(), None);
    }
}
