//! The `place` operator: splits each featurized batch into pieces by destination rank.

use timely::dataflow::StreamVec;
use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::Operator;

use hydrant_operators::Batch;

use super::Delivery;
use super::piece::{Piece, split};

/// Places the rows of a stream of featurized batches, each stamped (`seq`) with the time
/// of its first row ([`Delivery::time`]).
pub trait PlaceRows<'s> {
    /// One piece per rank that receives rows of a batch, at the batch's time.
    fn place_rows(self, delivery: Delivery) -> StreamVec<'s, u64, Piece>;
}

impl<'s> PlaceRows<'s> for StreamVec<'s, u64, Batch> {
    fn place_rows(self, delivery: Delivery) -> StreamVec<'s, u64, Piece> {
        self.unary(Pipeline, "Place", move |_, _| {
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
                        split(
                            plan.placement(),
                            epoch,
                            rows,
                            pos,
                            delivery.indices(epoch),
                            &b.data,
                            &mut pieces,
                        );
                        session.give_iterator(pieces.drain(..));
                    }
                });
            }
        })
    }
}
