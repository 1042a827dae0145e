//! The `place` operator: featurizes each batch and splits it into pieces by destination
//! rank, or, for rows of shuffled steps this process fills, featurizes the rows straight
//! into their steps (see `transform/into.rs` in hydrant-operators).

use arrow::array::{AsArray, RecordBatch};
use std::sync::Arc;

use arrow::datatypes::UInt64Type;
use timely::container::CapacityContainerBuilder;
use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::Operator;
use timely::dataflow::{Stream, StreamVec};

use hydrant_operators::{Batch, ErrorSlot, ROW_ID, Transformer};

use super::Delivery;
use super::arena::{Arena, RankCounts};
use super::assemble::{slot_rows, step_runs};
use super::fill::Pick;
use super::piece::{Piece, split, split_at, strided_picks};
use super::placement::Placement;
use super::plan::Ownership;
use super::wire::Pieces;

/// Featurizes and places the rows of a stream of raw batches, each stamped (`seq`) with
/// where its first row sits: `epoch · rows + position`.
pub trait PlaceRows<'s> {
    /// Featurizes each batch with `transformer`; one piece per rank that receives rows of
    /// it, at the batch's time. With
    /// [`Delivery::only`], a batch holds only that rank's rows, not all of a run of
    /// positions: their `row_id`s say where each sits.
    ///
    /// With `fill` (this process's arena, the ranks' ownership and this process's index),
    /// rows for ranks this process owns are put in the arena here, and their pieces only
    /// count them; a batch whose every row is one of them is featurized straight into its
    /// steps.
    fn place_rows(
        self,
        transformer: Transformer,
        delivery: Delivery,
        fill: Option<(Arc<Arena>, Ownership, usize)>,
        errors: ErrorSlot,
    ) -> Stream<'s, u64, Pieces>;
}

impl<'s> PlaceRows<'s> for StreamVec<'s, u64, Batch> {
    fn place_rows(
        self,
        mut transformer: Transformer,
        delivery: Delivery,
        fill: Option<(Arc<Arena>, Ownership, usize)>,
        errors: ErrorSlot,
    ) -> Stream<'s, u64, Pieces> {
        let schema = transformer.plan().output_schema();
        self.unary::<CapacityContainerBuilder<Pieces>, _, _, _>(Pipeline, "Place", move |_, _| {
            let mut pieces = Vec::new();
            let (mut steps, mut picks) = (Vec::new(), Vec::new());
            move |input, output| {
                let _running = hydrant_operators::running::enter("place");
                input.for_each(|time, data| {
                    let mut session = output.session(&time);
                    let (plan, rows) = (&delivery.plan, delivery.plan.positions());
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
                            let t = &mut transformer;
                            let put =
                                into_arena(arena, t, &steps, &mut picks, epoch, &b.data, &errors);
                            for (rank, counts) in put {
                                session.give(Piece::filled(epoch, rank, counts, schema.clone()));
                            }
                            continue;
                        }
                        let Some(data) = featurize(&mut transformer, &b.data, &errors) else {
                            continue;
                        };
                        if delivery.only.is_none() {
                            split(
                                plan.placement(),
                                epoch,
                                rows,
                                pos,
                                deliver,
                                &data,
                                &mut pieces,
                            );
                        } else if let Some(ids) = row_ids(&data) {
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
                                &data,
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

/// Featurizes `batch` (of `epoch`), a batch of rows of strided windows of this process's
/// ranks, into the arena's steps that `steps` and `picks` name (see [`strided_picks`]);
/// returns the rows put into each step of each rank (none if it failed, the error in
/// `errors`).
fn into_arena(
    arena: &Arena,
    transformer: &mut Transformer,
    steps: &[(u64, usize)],
    picks: &mut [Pick],
    epoch: u64,
    batch: &RecordBatch,
    errors: &ErrorSlot,
) -> Vec<RankCounts> {
    let put = if picks.len() == batch.num_rows() {
        let _running = hydrant_operators::running::enter("featurize");
        arena.featurize_picks(epoch, transformer, batch, steps, picks)
    } else {
        // Rows left out (a resumed epoch's first steps) are featurized too, so the batch
        // is featurized whole and the rows delivered copied from it.
        match featurize(transformer, batch, errors) {
            Some(data) => arena.put_picks(epoch, &data, steps, picks),
            None => return Vec::new(),
        }
    };
    match put {
        Ok(by_rank) => by_rank,
        Err(e @ crate::error::Error::Op(_)) => {
            errors.set("featurize", e);
            Vec::new()
        }
        Err(e) => {
            errors.set("place", e);
            Vec::new()
        }
    }
}

/// `batch` featurized; `None` (with the error in `errors`) if it failed.
fn featurize(t: &mut Transformer, batch: &RecordBatch, errors: &ErrorSlot) -> Option<RecordBatch> {
    let _running = hydrant_operators::running::enter("featurize");
    t.apply(batch).map_err(|e| errors.set("featurize", e)).ok()
}

/// Puts `piece`'s rows in the arena; returns the piece that counts them for the owner.
fn put(arena: &Arena, placement: &Placement, piece: &Piece) -> crate::error::Result<Piece> {
    let runs = step_runs(placement, piece.rank, piece)?;
    arena.put_runs((piece.epoch, piece.rank), piece.batch(), &runs)?;
    let counts = runs
        .iter()
        .map(|(step, picks)| (*step, slot_rows(picks)))
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
