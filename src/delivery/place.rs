//! The `place` operator: splits each featurized batch into pieces by destination rank.

use arrow::array::{AsArray, RecordBatch};
use std::sync::Arc;

use arrow::datatypes::UInt64Type;
use timely::container::CapacityContainerBuilder;
use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::Operator;
use timely::dataflow::{Stream, StreamVec};

use hydrant_operators::{Batch, ErrorSlot, ROW_ID};

use super::Delivery;
use super::arena::Arena;
use super::assemble::step_runs;
use super::piece::{Piece, split, split_at};
use super::placement::Placement;
use super::plan::Ownership;
use super::wire::Pieces;

/// Places the rows of a stream of featurized batches, each stamped (`seq`) with where its
/// first row sits: `epoch · rows + position`.
pub trait PlaceRows<'s> {
    /// One piece per rank that receives rows of a batch, at the batch's time. With
    /// [`Delivery::only`], a batch holds only that rank's rows, not all of a run of
    /// positions: their `row_id`s say where each sits.
    ///
    /// With `fill` (this process's arena, the ranks' ownership and this process's index),
    /// rows for ranks this process owns are put in the arena here, and their pieces only
    /// count them.
    fn place_rows(
        self,
        delivery: Delivery,
        fill: Option<(Arc<Arena>, Ownership, usize)>,
        errors: ErrorSlot,
    ) -> Stream<'s, u64, Pieces>;
}

impl<'s> PlaceRows<'s> for StreamVec<'s, u64, Batch> {
    fn place_rows(
        self,
        delivery: Delivery,
        fill: Option<(Arc<Arena>, Ownership, usize)>,
        errors: ErrorSlot,
    ) -> Stream<'s, u64, Pieces> {
        self.unary::<CapacityContainerBuilder<Pieces>, _, _, _>(Pipeline, "Place", move |_, _| {
            let mut pieces = Vec::new();
            move |input, output| {
                let _running = hydrant_operators::running::enter("place");
                input.for_each(|time, data| {
                    let mut session = output.session(&time);
                    let (plan, rows) = (&delivery.plan, delivery.plan.rows());
                    for b in data.drain(..) {
                        if rows == 0 {
                            continue;
                        }
                        let (epoch, pos) = (b.seq / rows, b.seq % rows);
                        let deliver = delivery.indices(epoch);
                        if delivery.only.is_none() {
                            split(
                                plan.placement(),
                                epoch,
                                rows,
                                pos,
                                deliver,
                                &b.data,
                                &mut pieces,
                            );
                        } else if let Some(ids) = row_ids(&b.data) {
                            // Rows of one unit: positions follow row ids.
                            let base = ids.first().copied().unwrap_or(0);
                            let positions = ids.iter().map(|&id| pos + id.saturating_sub(base));
                            let placement = plan.placement();
                            split_at(
                                placement,
                                epoch,
                                rows,
                                positions,
                                &deliver,
                                &b.data,
                                &mut pieces,
                            );
                        } else {
                            errors.set("place", format!("a featurized batch has no `{ROW_ID}`"));
                        }
                        for piece in pieces.drain(..) {
                            let piece = match &fill {
                                Some((arena, ownership, process))
                                    if ownership.process(piece.rank) == *process =>
                                {
                                    if let Err(e) = put(arena, plan.placement(), &piece) {
                                        errors.set("place", e);
                                        return;
                                    }
                                    piece.into_filled()
                                }
                                _ => piece,
                            };
                            session.give(piece);
                        }
                    }
                });
            }
        })
    }
}

/// Puts `piece`'s rows in the arena.
fn put(arena: &Arena, placement: &Placement, piece: &Piece) -> crate::error::Result<()> {
    let runs = step_runs(placement, piece.rank, piece)?;
    arena.put_runs((piece.epoch, piece.rank), piece.batch(), &runs)
}

fn row_ids(batch: &RecordBatch) -> Option<&[u64]> {
    let ids = batch
        .column_by_name(ROW_ID)?
        .as_primitive_opt::<UInt64Type>()?;
    Some(ids.values())
}
