//! The `own` operator: on the worker that owns a rank, assembles the rank's steps from the
//! pieces readers send it and emits them in step order, epoch after epoch.
//!
//! It holds a capability at the time of the earliest step it has not emitted
//! ([`Delivery::step_time`]), so a probe after it tells readers how far the slowest owner
//! has come: that is the flow control that bounds memory.
//!
//! A step goes out as soon as its rows are in. A rank's trainer waits for the others at
//! every step (all-reduce) and its owner blocks when the rank's loader is full, so an
//! owner must never hold rows of a step another rank still needs: readers are dealt only
//! the shares of the ranks their worker owns (`runtime::read::deal`; the tail, the one
//! part read for every rank, is the epoch's last step). Reads dealt to workers in turn did
//! hold such rows, and `tests/train.rs` hung; letting a step out only once the input
//! frontier had passed it also prevented that, and cost 13-20 MB of peak memory and 7% of
//! the time (criteo_hash, 2 ranks, 1M and 10M rows), so dealing by share is what keeps it.
//!
//! A worker that owns several ranks emits their steps in lockstep — step `s` of every one
//! of them before step `s + 1` of any — because the sink after it blocks when a rank's
//! loader is full: a rank that ran ahead must never hold up, in the same worker, the step
//! a slower rank's trainer waits for (its all-reduce would wait forever).

use std::collections::VecDeque;
use std::sync::Arc;

use arrow::datatypes::Schema;
use hydrant_operators::ErrorSlot;
use timely::container::CapacityContainerBuilder;
use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::Operator;
use timely::dataflow::{Stream, StreamVec};

use super::Delivery;
use super::arena::Arena;
use super::assemble::Assembler;
use super::batch::RankBatch;
use super::wire::Pieces;
use crate::error::Result;

/// Assembles the steps of `ranks` (those this worker owns; the stream must bring it
/// every piece of them), filling shuffled steps in `arena` when there is one. Errors go to
/// `errors`, and the operator then lets go.
pub fn own<'s>(
    stream: Stream<'s, u64, Pieces>,
    delivery: Delivery,
    arena: Option<Arc<Arena>>,
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
            let made: Result<Vec<Owned>> = ranks
                .iter()
                .map(|&r| {
                    let assembler =
                        Assembler::new(placement, r, &output, state_version, rows, start)?
                            .with_arena(arena.clone());
                    Ok(Owned {
                        assembler,
                        cut: VecDeque::new(),
                    })
                })
                .collect();
            let mut owners = made.map_err(|e| errors.set("own", e)).unwrap_or_default();
            let mut cap = Some(cap);
            move |(input, frontier), output| {
                let _running = hydrant_operators::running::enter("own");
                let mut failed = None;
                input.for_each(|_, data| {
                    let pieces = match data.take() {
                        Ok(pieces) => pieces,
                        Err(e) => {
                            failed.get_or_insert(e);
                            return;
                        }
                    };
                    for piece in pieces {
                        let owner = owners.iter_mut().find(|o| o.assembler.rank() == piece.rank);
                        let pushed = match owner {
                            Some(o) => o.assembler.push(&piece),
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
                    if let Err(e) = o.advance(&delivery) {
                        failed.get_or_insert(e.to_string());
                    }
                }
                // Lockstep: a step goes out once every rank here has it.
                while !owners.is_empty() && owners.iter().all(|o| !o.cut.is_empty()) {
                    let mut session = output.session(&*c);
                    for o in &mut owners {
                        session.give_iterator(o.cut.pop_front().into_iter());
                    }
                }
                let waiting = owners
                    .iter()
                    .map(Owned::next)
                    .filter(|&(epoch, _)| epoch < delivery.epochs)
                    .min();
                if let Some((epoch, step)) =
                    waiting.filter(|_| failed.is_none() && frontier.is_empty())
                {
                    failed = Some(format!(
                        "the input ended while step {step} of epoch {epoch} still waited for rows"
                    ));
                }
                match (failed, waiting) {
                    (Some(e), _) => {
                        errors.set("own", e);
                        cap = None;
                    }
                    (None, None) => cap = None,
                    (None, Some((epoch, step))) => {
                        c.downgrade(&delivery.step_time(epoch, step));
                    }
                }
            }
        },
    )
}

/// One owned rank: its assembler, and the steps cut but not yet emitted.
struct Owned {
    assembler: Assembler,
    cut: VecDeque<RankBatch>,
}

impl Owned {
    /// The first step not emitted.
    fn next(&self) -> (u64, u64) {
        self.cut
            .front()
            .map_or(self.assembler.next(), |rb| (rb.meta.epoch, rb.meta.step))
    }

    /// Cuts the steps that are complete, moving on through the epochs it finishes.
    fn advance(&mut self, delivery: &Delivery) -> Result<()> {
        let mut out = Vec::new();
        loop {
            let (epoch, _) = self.assembler.next();
            if epoch >= delivery.epochs {
                break;
            }
            self.assembler.ready(&mut out)?;
            if !self.assembler.epoch_done() {
                break;
            }
            self.assembler
                .start_epoch(epoch + 1, delivery.first_step(epoch + 1));
        }
        self.cut.extend(out);
        Ok(())
    }
}
