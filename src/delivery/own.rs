//! The `own` operator: on the worker that owns a rank, assembles the rank's steps from the
//! pieces readers send it and emits them in step order, epoch after epoch.
//!
//! It holds a capability at the time of the earliest step its ranks still wait for
//! ([`Delivery::step_time`]), so a probe after it tells readers how far the slowest owner
//! has come: that is the flow control that bounds memory.

use std::sync::Arc;

use arrow::datatypes::Schema;
use hydrant_operators::ErrorSlot;
use timely::container::CapacityContainerBuilder;
use timely::dataflow::StreamVec;
use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::Operator;

use super::Delivery;
use super::assemble::Assembler;
use super::batch::RankBatch;
use super::piece::Piece;
use crate::error::Result;

/// Assembles the steps of `ranks` (those this worker owns; the stream must bring it
/// every piece of them). Errors go to `errors`, and the operator then lets go.
pub fn own<'s>(
    stream: StreamVec<'s, u64, Piece>,
    delivery: Delivery,
    ranks: Vec<usize>,
    output: Arc<Schema>,
    state_version: u64,
    errors: ErrorSlot,
) -> StreamVec<'s, u64, RankBatch> {
    stream.unary_frontier::<CapacityContainerBuilder<Vec<RankBatch>>, _, _, _>(
        Pipeline,
        "Own",
        move |cap, _| {
            let start = (delivery.start_epoch, delivery.start_step);
            let rows = Some(delivery.plan.rows());
            let placement = *delivery.plan.placement();
            let made: Result<Vec<Assembler>> = ranks
                .iter()
                .map(|&r| Assembler::new(placement, r, &output, state_version, rows, start))
                .collect();
            let mut owners = made.map_err(|e| errors.set("own", e)).unwrap_or_default();
            let mut cap = Some(cap);
            let mut out = Vec::new();
            move |(input, frontier), output| {
                let mut failed = None;
                input.for_each(|_, data| {
                    for piece in data.drain(..) {
                        let owner = owners.iter_mut().find(|o| o.rank() == piece.rank);
                        let pushed = match owner {
                            Some(o) => o.push(&piece),
                            None => Err(crate::Error::Dataflow(format!(
                                "a piece of rank {} reached a worker that does not own it",
                                piece.rank
                            ))),
                        };
                        if let Err(e) = pushed {
                            failed.get_or_insert(e.to_string());
                        }
                    }
                });
                let Some(c) = &mut cap else {
                    return;
                };
                for o in &mut owners {
                    if let Err(e) = advance(o, &delivery, &mut out) {
                        failed.get_or_insert(e.to_string());
                    }
                }
                if !out.is_empty() {
                    output.session(&*c).give_iterator(out.drain(..));
                }
                let waiting = owners
                    .iter()
                    .filter(|o| o.next().0 < delivery.epochs)
                    .min_by_key(|o| o.next());
                if let Some(o) = waiting.filter(|_| failed.is_none() && frontier.is_empty()) {
                    let (epoch, step) = o.next();
                    failed = Some(format!(
                        "the input ended while rank {} still waited for step {step} of epoch \
                         {epoch}",
                        o.rank()
                    ));
                }
                match (failed, waiting) {
                    (Some(e), _) => {
                        errors.set("own", e);
                        cap = None;
                    }
                    (None, None) => cap = None,
                    (None, Some(o)) => {
                        let (epoch, step) = o.next();
                        c.downgrade(&delivery.step_time(epoch, step));
                    }
                }
            }
        },
    )
}

/// Emits what `owner` can, moving on through the epochs it finishes.
fn advance(owner: &mut Assembler, delivery: &Delivery, out: &mut Vec<RankBatch>) -> Result<()> {
    loop {
        let (epoch, _) = owner.next();
        if epoch >= delivery.epochs {
            return Ok(());
        }
        owner.ready(out)?;
        if !owner.epoch_done() {
            return Ok(());
        }
        owner.start_epoch(epoch + 1, delivery.first_step(epoch + 1));
    }
}
