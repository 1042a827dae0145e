//! The `featurize` timely operator: applies a [`Transformer`] to every batch of a stream.

use std::sync::{Arc, Mutex};

use timely::dataflow::StreamVec;
use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::generic::operator::Operator;
use timely::progress::Timestamp;

use crate::batch::Batch;
use crate::transform::Transformer;

/// Where an operator leaves the first error it meets, for the worker's loop to notice and
/// stop on: a dataflow has no other way to hand an error back to its caller.
#[derive(Debug, Clone, Default)]
pub struct ErrorSlot(Arc<Mutex<Option<String>>>);

impl ErrorSlot {
    /// Records `error` (with the operator's name) unless an earlier one is there.
    pub fn set(&self, operator: &str, error: impl std::fmt::Display) {
        let mut slot = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            *slot = Some(format!("{operator}: {error}"));
        }
    }

    /// Records `message` as it is (it names where it happened) unless an earlier one is
    /// there.
    pub fn set_message(&self, message: &str) {
        let mut slot = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            *slot = Some(message.to_string());
        }
    }

    /// The first error recorded, if any.
    pub fn get(&self) -> Option<String> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
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
