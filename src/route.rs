//! The `Route` operator: puts featurized batches back into epoch order and cuts them into
//! rank batches with the [`Rebatcher`].
//!
//! Timestamps are positions: a batch's time is `epoch × rows + position of its first row`
//! in the epoch's unit order, so readers on any worker advance through one shared clock.
//! The router (on worker 0) keeps a capability at the first position it still waits for;
//! a reader runs at most a window of rows ahead of it (see [`crate::dataflow`]), which
//! bounds what the router must hold whatever the dataset's size.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::Schema;
use hydrant_operators::{Batch, ErrorSlot};
use timely::container::CapacityContainerBuilder;
use timely::dataflow::StreamVec;
use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::Operator;

use crate::epoch::EpochPlan;
use crate::error::{Error, Result};
use crate::rebatch::{RankBatch, Rebatcher};

/// What to deliver: epochs `start_epoch..epochs`, the first from `start_step` on.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// Rows to ranks and steps.
    pub plan: Arc<EpochPlan>,
    /// Epochs in the run (the last is `epochs - 1`).
    pub epochs: u64,
    /// First epoch delivered.
    pub start_epoch: u64,
    /// First step delivered in `start_epoch`.
    pub start_step: u64,
}

impl Delivery {
    /// The timestamp of position `pos` of epoch `epoch`.
    pub fn time(&self, epoch: u64, pos: u64) -> u64 {
        epoch * self.plan.rows() + pos
    }

    /// The step delivery starts at in `epoch`.
    pub fn first_step(&self, epoch: u64) -> u64 {
        if epoch == self.start_epoch {
            self.start_step
        } else {
            0
        }
    }
}

struct Router {
    delivery: Delivery,
    rebatcher: Rebatcher,
    epoch: u64,
    /// Non-empty units of the epoch: (first position, rows, skipped).
    units: Vec<(u64, u64, bool)>,
    unit: usize,
    /// Next position of the epoch to consume.
    pos: u64,
    stash: BTreeMap<u64, RecordBatch>,
    done: bool,
}

impl Router {
    fn new(delivery: Delivery, output: &Schema, state_version: u64) -> Result<Self> {
        let rebatcher = Rebatcher::new(delivery.plan.clone(), output, state_version)?;
        let mut r = Router {
            epoch: delivery.start_epoch,
            rebatcher,
            delivery,
            units: Vec::new(),
            unit: 0,
            pos: 0,
            stash: BTreeMap::new(),
            done: false,
        };
        r.load_epoch();
        Ok(r)
    }

    fn load_epoch(&mut self) {
        if self.epoch >= self.delivery.epochs {
            self.done = true;
            return;
        }
        let plan = &self.delivery.plan;
        let skip = plan.skippable(self.epoch, self.delivery.first_step(self.epoch));
        self.units = plan
            .unit_positions(self.epoch)
            .into_iter()
            .map(|(u, pos, rows)| (pos, rows, skip[u]))
            .collect();
        self.unit = 0;
        self.pos = 0;
        self.rebatcher
            .start_epoch(self.epoch, self.delivery.first_step(self.epoch));
    }

    /// The time of the first position not yet consumed.
    fn cursor(&self) -> u64 {
        self.delivery.time(self.epoch, self.pos)
    }

    /// Consumes every batch that is next in order.
    fn advance(&mut self, out: &mut Vec<RankBatch>) -> Result<()> {
        while !self.done {
            let Some(&(first, rows, skipped)) = self.units.get(self.unit) else {
                self.rebatcher.finish_epoch(out)?;
                self.epoch += 1;
                self.load_epoch();
                continue;
            };
            if skipped {
                self.rebatcher.push_skipped(rows, out)?;
                self.pos = first + rows;
            } else {
                let Some(batch) = self.stash.remove(&self.cursor()) else {
                    return Ok(());
                };
                self.pos += batch.num_rows() as u64;
                if self.pos > first + rows {
                    return Err(Error::Dataflow(format!(
                        "a unit of epoch {} yielded more rows than its footer says",
                        self.epoch
                    )));
                }
                self.rebatcher.push(batch, out)?;
            }
            if self.pos == first + rows {
                self.unit += 1;
            }
        }
        Ok(())
    }
}

/// Routes a stream of featurized batches (all sent to the worker where `active`) into
/// rank batches. Errors go to `errors`, and the operator then lets go of its input.
pub fn route<'s>(
    stream: StreamVec<'s, u64, Batch>,
    delivery: Delivery,
    output: Arc<Schema>,
    state_version: u64,
    active: bool,
    errors: ErrorSlot,
) -> StreamVec<'s, u64, RankBatch> {
    stream.unary_frontier::<CapacityContainerBuilder<Vec<RankBatch>>, _, _, _>(
        Pipeline,
        "Route",
        move |cap, _| {
            let router = if active {
                Router::new(delivery, &output, state_version)
                    .map_err(|e| errors.set("route", e))
                    .ok()
            } else {
                None
            };
            let mut cap = router.as_ref().map(|_| cap);
            let mut router = router;
            let mut out = Vec::new();
            move |(input, frontier), output| {
                input.for_each(|_, data| {
                    if let Some(r) = &mut router {
                        for b in data.drain(..) {
                            r.stash.insert(b.seq, b.data);
                        }
                    }
                });
                let (Some(r), Some(c)) = (&mut router, &mut cap) else {
                    return;
                };
                let result = r.advance(&mut out);
                if !out.is_empty() {
                    let mut session = output.session(&*c);
                    for rb in out.drain(..) {
                        session.give(rb);
                    }
                }
                let failed = match result {
                    Err(e) => Some(e.to_string()),
                    Ok(()) if !r.done && frontier.is_empty() => Some(format!(
                        "input ended at row {} of epoch {} with rows still expected",
                        r.pos, r.epoch
                    )),
                    Ok(()) => None,
                };
                if let Some(e) = &failed {
                    errors.set("route", e);
                }
                if r.done || failed.is_some() {
                    cap = None;
                    router = None;
                } else {
                    c.downgrade(&r.cursor());
                }
            }
        },
    )
}
