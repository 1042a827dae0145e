//! The pushed rows worker 0 holds until their shuffle window is full (its order is fixed
//! only then), in stream order.
//!
//! Rows become ready in position order, so only a prefix of what is held is ever taken:
//! each push costs the same however much is held. Short batches (a producer pushing rows
//! one at a time) are joined before they are held, so that a window's rows are not held,
//! and then placed, as tens of thousands of batches with arrays of their own.

use std::collections::VecDeque;

use arrow::array::RecordBatch;
use arrow::compute::concat_batches;
use arrow::error::ArrowError;

/// Batches shorter than this are joined with the ones after them before they are held:
/// each row is copied once more, against a batch's arrays and its placing for every one.
const JOIN_BELOW: usize = 1024;

/// Rows taken and not yet placed: `(first position, rows)`, positions increasing.
#[derive(Default)]
pub(super) struct Held {
    batches: VecDeque<(u64, RecordBatch)>,
    /// Short batches not joined yet, the first at position `short_first`.
    short: Vec<RecordBatch>,
    short_first: u64,
    short_rows: usize,
}

impl Held {
    /// Holds `batch`, whose first row is at position `first`, right after the rows held.
    pub fn push(&mut self, first: u64, batch: RecordBatch) -> Result<(), ArrowError> {
        let n = batch.num_rows();
        if n == 0 {
            // Nothing to place; held, it would never be ready and stop every row after it.
            return Ok(());
        }
        if n >= JOIN_BELOW {
            self.join()?;
            self.batches.push_back((first, batch));
            return Ok(());
        }
        if self.short.is_empty() {
            self.short_first = first;
        }
        self.short_rows += n;
        self.short.push(batch);
        if self.short_rows >= JOIN_BELOW {
            self.join()?;
        }
        Ok(())
    }

    /// Hands `each` the rows held at positions before `end`, in order, with the position
    /// of each batch's first row; the rest stay held.
    pub fn take_before(
        &mut self,
        end: u64,
        mut each: impl FnMut(u64, RecordBatch),
    ) -> Result<(), ArrowError> {
        if !self.short.is_empty() && self.short_first < end {
            self.join()?;
        }
        while let Some((first, batch)) = self.batches.pop_front() {
            let n = batch.num_rows() as u64;
            let ready = end.saturating_sub(first).min(n);
            if ready == 0 {
                self.batches.push_front((first, batch));
                break;
            }
            if ready < n {
                let rest = batch.slice(ready as usize, (n - ready) as usize);
                self.batches.push_front((first + ready, rest));
                each(first, batch.slice(0, ready as usize));
                break;
            }
            each(first, batch);
        }
        Ok(())
    }

    /// Moves the short batches into `batches`, as one.
    fn join(&mut self) -> Result<(), ArrowError> {
        let short = std::mem::take(&mut self.short);
        self.short_rows = 0;
        let batch = match short.as_slice() {
            [] => return Ok(()),
            [one] => one.clone(),
            many => concat_batches(&many[0].schema(), many)?,
        };
        self.batches.push_back((self.short_first, batch));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delivery::assemble_tests::rows;
    use arrow::array::AsArray;
    use arrow::datatypes::UInt64Type;

    /// The row ids (positions here) `each` was handed, and the batches it was handed.
    fn take(held: &mut Held, end: u64) -> (Vec<u64>, usize) {
        let (mut ids, mut batches) = (Vec::new(), 0);
        held.take_before(end, |first, b| {
            let got = b.column(0).as_primitive::<UInt64Type>().values().to_vec();
            assert_eq!(got.first(), Some(&first), "a batch's first position");
            ids.extend(got);
            batches += 1;
        })
        .unwrap();
        (ids, batches)
    }

    #[test]
    fn rows_come_out_in_order_once_their_end_is_passed_and_not_before() {
        let mut held = Held::default();
        let mut at = 0;
        for n in [3000, 1, 1, 5, 2000, 7] {
            held.push(at, rows(at, n)).unwrap();
            at += n as u64;
        }
        let (ids, _) = take(&mut held, 2500);
        assert_eq!(ids, (0..2500).collect::<Vec<_>>());
        assert_eq!(take(&mut held, 2500).0, Vec::<u64>::new());
        let (ids, _) = take(&mut held, 3003);
        assert_eq!(ids, (2500..3003).collect::<Vec<_>>());
        let (ids, _) = take(&mut held, u64::MAX);
        assert_eq!(ids, (3003..at).collect::<Vec<_>>());
    }

    /// An empty push (a batch whose rows were all before a commit's row, say) is not
    /// held: a batch with no rows is never ready, and the rows after it would wait on it.
    #[test]
    fn an_empty_batch_holds_nothing_up() {
        let mut held = Held::default();
        held.push(0, rows(0, 0)).unwrap();
        held.push(0, rows(0, 3000)).unwrap();
        held.push(3000, rows(3000, 0)).unwrap();
        held.push(3000, rows(3000, 5)).unwrap();
        assert_eq!(take(&mut held, 3005).0, (0..3005).collect::<Vec<_>>());
    }

    /// Found by a hostile run: one-row pushes into a shuffled stream held every row as a
    /// batch of its own, and each push sliced every batch held (37 s of CPU for 10,000).
    #[test]
    fn short_batches_are_held_joined() {
        let mut held = Held::default();
        for at in 0..5000 {
            held.push(at, rows(at, 1)).unwrap();
        }
        assert!(
            held.batches.len() <= 5,
            "{} batches held",
            held.batches.len()
        );
        let (ids, batches) = take(&mut held, 4500);
        assert_eq!(ids, (0..4500).collect::<Vec<_>>());
        assert!(batches <= 5, "{batches}");
        let (ids, _) = take(&mut held, u64::MAX);
        assert_eq!(ids, (4500..5000).collect::<Vec<_>>());
    }
}
