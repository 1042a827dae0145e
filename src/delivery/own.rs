//! The `own` operator: on the worker that owns a rank, assembles the rank's steps from the
//! pieces readers send it and emits them in step order, epoch after epoch — or, for pushed
//! and followed input, through one endless stream ([`Owning::Stream`]).
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
use std::sync::{Arc, OnceLock};

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
use super::placement::Placement;
use super::wire::Pieces;
use crate::error::Result;

/// What owners assemble: the epochs of a run over files, or one endless stream.
#[derive(Debug, Clone)]
pub enum Owning {
    /// Epochs of a known number of rows.
    Epochs(Delivery),
    /// A stream (pushed or followed input), placed by `placement` (its stream form) from
    /// step `start_step` on. `end` is set to its rows once it ends, before the input
    /// closes: owners then pad (or drop) its last step. An input that closes with `end`
    /// unset was abandoned: the steps already complete go out, and nothing else.
    Stream {
        /// How the stream's rows are placed.
        placement: Placement,
        /// The first step delivered.
        start_step: u64,
        /// The stream's rows, once it ends.
        end: Arc<OnceLock<u64>>,
    },
}

impl Owning {
    fn placement(&self) -> Placement {
        match self {
            Owning::Epochs(d) => *d.plan.placement(),
            Owning::Stream { placement, .. } => *placement,
        }
    }

    /// Rows of each epoch, `None` for a stream.
    fn rows(&self) -> Option<u64> {
        match self {
            Owning::Epochs(d) => Some(d.plan.positions()),
            Owning::Stream { .. } => None,
        }
    }

    fn start(&self) -> (u64, u64) {
        match self {
            Owning::Epochs(d) => (d.start_epoch, d.start_step),
            Owning::Stream { start_step, .. } => (0, *start_step),
        }
    }

    fn epochs(&self) -> u64 {
        match self {
            Owning::Epochs(d) => d.epochs,
            Owning::Stream { .. } => 1,
        }
    }

    fn first_step(&self, epoch: u64) -> u64 {
        match self {
            Owning::Epochs(d) => d.first_step(epoch),
            Owning::Stream { .. } => 0,
        }
    }

    fn step_time(&self, epoch: u64, step: u64) -> u64 {
        match self {
            Owning::Epochs(d) => d.step_time(epoch, step),
            Owning::Stream { placement, .. } => placement.step_time(step),
        }
    }
}

/// Assembles the steps of `ranks` (those this worker owns; the stream must bring it
/// every piece of them), filling shuffled steps in `arena` when there is one. Errors go to
/// `errors`, and the operator then lets go.
pub fn own<'s>(
    stream: Stream<'s, u64, Pieces>,
    delivery: Owning,
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
            let (start, rows, placement) =
                (delivery.start(), delivery.rows(), delivery.placement());
            let made: Result<Vec<Owned>> = ranks
                .iter()
                .map(|&r| {
                    let assembler =
                        Assembler::new(placement, r, &output, state_version, rows, start)?
                            .with_arena(arena.clone());
                    Ok(Owned {
                        assembler,
                        cut: VecDeque::new(),
                        abandoned: false,
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
                if let Owning::Stream { end, .. } = &delivery {
                    match end.get() {
                        // Set before the last rows are sent: the last step is cut as the
                        // stream's end says (a rank's part may be complete and dropped).
                        Some(&rows) => owners.iter_mut().for_each(|o| o.assembler.end_stream(rows)),
                        // Abandoned: what is complete goes out below, the rest is let go.
                        None if frontier.is_empty() => {
                            owners.iter_mut().for_each(|o| o.abandoned = true)
                        }
                        None => {}
                    }
                }
                for o in &mut owners {
                    if let Err(e) = o.advance(&delivery) {
                        failed.get_or_insert(e.to_string());
                    }
                }
                // Lockstep: a step goes out once every rank here has it (or, after an
                // abandoned stream, once no rank here waits for any more). One session
                // for all of them: a session per step sent a container of timely's
                // default capacity (8 KiB) per one-row step, which at B = 1 held up to a
                // gigabyte of mostly empty containers in the channel to the consumers.
                let abandoned = owners.iter().all(|o| o.abandoned);
                let mut session = output.session(&*c);
                while !owners.is_empty()
                    && owners.iter().any(|o| !o.cut.is_empty())
                    && (abandoned || owners.iter().all(|o| !o.cut.is_empty()))
                {
                    for o in &mut owners {
                        session.give_iterator(o.cut.pop_front().into_iter());
                    }
                }
                drop(session);
                let waiting = owners
                    .iter()
                    .filter(|o| !o.abandoned)
                    .map(Owned::next)
                    .filter(|&(epoch, _)| epoch < delivery.epochs())
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
    /// Its stream was abandoned: it waits for no more rows.
    abandoned: bool,
}

impl Owned {
    /// The first step not emitted.
    fn next(&self) -> (u64, u64) {
        self.cut
            .front()
            .map_or(self.assembler.next(), |rb| (rb.meta.epoch, rb.meta.step))
    }

    /// Cuts the steps that are complete, moving on through the epochs it finishes.
    fn advance(&mut self, delivery: &Owning) -> Result<()> {
        let mut out = Vec::new();
        loop {
            let (epoch, _) = self.assembler.next();
            if epoch >= delivery.epochs() {
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
