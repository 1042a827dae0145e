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
use super::piece::{Piece, split, split_at, strided_picks};
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
            let (mut steps, mut picks) = (Vec::new(), Vec::new());
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
                        // Rows of strided windows of this process's ranks go straight into
                        // the arena, each placed once.
                        if let Some((arena, ownership, process)) = &fill
                            && delivery.only.is_none()
                            && strided_picks(
                                plan.placement(),
                                epoch,
                                rows,
                                (pos, b.data.num_rows()),
                                &deliver,
                                |rank| ownership.process(rank) == *process,
                                &mut steps,
                                &mut picks,
                            )
                        {
                            match arena.put_picks(epoch, &b.data, &steps, &mut picks) {
                                Ok(by_rank) => {
                                    for (rank, counts) in by_rank {
                                        let schema = b.data.schema();
                                        session.give(Piece::filled(epoch, rank, counts, schema));
                                    }
                                }
                                Err(e) => return errors.set("place", e),
                            }
                            continue;
                        }
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
                                    match put(arena, plan.placement(), &piece) {
                                        Ok(filled) => filled,
                                        Err(e) => return errors.set("place", e),
                                    }
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

/// Puts `piece`'s rows in the arena; returns the piece that counts them for the owner.
fn put(arena: &Arena, placement: &Placement, piece: &Piece) -> crate::error::Result<Piece> {
    let runs = step_runs(placement, piece.rank, piece)?;
    arena.put_runs((piece.epoch, piece.rank), piece.batch(), &runs)?;
    let counts = runs
        .iter()
        .map(|(step, picks)| (*step, picks.len()))
        .collect();
    Ok(Piece::filled(
        piece.epoch,
        piece.rank,
        counts,
        piece.batch().schema(),
    ))
}

fn row_ids(batch: &RecordBatch) -> Option<&[u64]> {
    let ids = batch
        .column_by_name(ROW_ID)?
        .as_primitive_opt::<UInt64Type>()?;
    Some(ids.values())
}
