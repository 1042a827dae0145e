//! Pushed input as a source of the timely dataflow: one endless epoch whose rows arrive
//! already featurized (DoPut featurizes and checks each batch before it acknowledges it)
//! and are placed, exchanged to each rank's owner and assembled by the same operators as
//! rows read from files.
//!
//! ```text
//! PushedRows::push_as ─► channel ─► worker 0: hold until a window is full, place ─► exchange ─► own ─► stamp, rank queues
//! ```
//!
//! The channel holds [`CHANNEL`] batches and worker 0 takes the next only while it is at
//! most a window and a few steps ahead of the slowest rank ([`Shared::steps_cut`]), and
//! owners block while a rank's queue is full: so a producer waits for its trainers and
//! memory is bounded by the window, whatever the number of rows.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex, OnceLock};

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use hydrant_operators::ErrorSlot;
use timely::container::CapacityContainerBuilder;
use timely::dataflow::ProbeHandle;
use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::core::input::Handle;
use timely::dataflow::operators::{Exchange, Input, Operator, Probe};
use timely::worker::Worker;

use super::cluster::Cluster;
use super::dataflow::{Channels, PARK, supervise};
use super::fate;
use super::held::Held;
use crate::delivery::{
    LastBatch, Ownership, Owning, Piece, Pieces, Placement, RankBatch, own, split,
};
use crate::error::{Error, Result};

/// Where worker 0 sends the pieces it places.
type PiecesIn = Handle<u64, CapacityContainerBuilder<Pieces>>;

/// Pushed batches the channel into the dataflow holds.
const CHANNEL: usize = 2;

/// What the producer side sends worker 0.
enum Message {
    /// The next featurized rows.
    Rows(RecordBatch),
    /// The stream ends after the rows sent.
    End,
}

/// What the dataflow and the producer side share.
struct Shared {
    /// The first step not yet emitted, per rank.
    next: Vec<AtomicU64>,
    /// Steps every rank has been given: the least of `next` (kept by the caller, which
    /// reports it without taking a lock).
    steps_cut: StepsCut,
    /// `(first step, version)`: the state version each step is stamped with, from its
    /// first step on.
    versions: Mutex<Vec<(u64, u64)>>,
    /// Rows worker 0 has taken, held ones included.
    taken: AtomicU64,
    /// The stream's rows, once it ends.
    end: Arc<OnceLock<u64>>,
}

/// Steps every rank of a pushed stream has been given (a resumed stream's count starts at
/// its first step), which only grows, with a way to wait for it: a restarted server gives
/// the ranks the steps after the last commit again as its trainers reconnect, and a
/// trainer's commit of one of those steps waits for that rather than fail.
#[derive(Debug, Clone)]
pub struct StepsCut(Arc<tokio::sync::watch::Sender<u64>>);

impl Default for StepsCut {
    fn default() -> Self {
        StepsCut(Arc::new(tokio::sync::watch::Sender::new(0)))
    }
}

impl StepsCut {
    /// Steps given to every rank.
    pub fn get(&self) -> u64 {
        *self.0.borrow()
    }

    /// Starts the count at `step` (a stream starting there).
    pub fn set(&self, step: u64) {
        self.0.send_replace(step);
    }

    /// Raises the count to `step`, if that is more.
    fn raise(&self, step: u64) {
        self.0.send_if_modified(|cut| {
            let more = step > *cut;
            if more {
                *cut = step;
            }
            more
        });
    }

    /// A receiver that sees the count change (for waiting on it).
    pub fn watch(&self) -> tokio::sync::watch::Receiver<u64> {
        self.0.subscribe()
    }
}

impl Shared {
    fn steps_cut(&self) -> u64 {
        self.steps_cut.get()
    }

    fn versions(&self) -> std::sync::MutexGuard<'_, Vec<(u64, u64)>> {
        self.versions
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// What pushed rows are and where they go: what the dataflow starts with (at the first
/// rows or the end).
pub struct Delivering {
    /// The plan's output schema.
    pub output: SchemaRef,
    /// The state the rows are featurized with, unless [`PushedRows::push_as`] says
    /// otherwise.
    pub state_version: u64,
    /// Each rank's queue.
    pub channels: Channels,
    /// Where the dataflow's first error is left.
    pub errors: ErrorSlot,
    /// Timely workers.
    pub workers: usize,
}

/// The producer's side of one endless epoch (epoch 0) of pushed rows, delivered from a
/// step on by a dataflow of its own. Dropping it without [`PushedRows::end`] abandons the
/// stream: the steps already complete go out, and the ranks' queues then end.
pub struct PushedRows {
    placement: Placement,
    /// Rows taken so far (stream positions: a stream resumed at a step starts past 0).
    rows: u64,
    /// The version of the last rows taken.
    version: u64,
    shared: Arc<Shared>,
    /// Not started yet.
    start: Option<Delivering>,
    tx: Option<SyncSender<Message>>,
    errors: ErrorSlot,
}

impl PushedRows {
    /// Rows placed by `placement` (its stream form) and delivered from step `step` on as
    /// `to` says; `steps_cut` is kept at the steps every rank has been given.
    pub fn new(placement: Placement, step: u64, steps_cut: StepsCut, to: Delivering) -> Self {
        let placement = placement.stream();
        steps_cut.set(step);
        let next = (0..placement.world_size()).map(|_| AtomicU64::new(step));
        let rows = placement.stream_start(step);
        PushedRows {
            placement,
            rows,
            version: to.state_version,
            shared: Arc::new(Shared {
                next: next.collect(),
                steps_cut,
                versions: Mutex::new(vec![(0, to.state_version)]),
                taken: AtomicU64::new(rows),
                end: Arc::default(),
            }),
            errors: to.errors.clone(),
            start: Some(to),
            tx: None,
        }
    }

    /// Takes the next featurized rows, featurized with state `version`, waiting while the
    /// ranks are too far behind. A version other than the last one's takes effect from
    /// the step of the rows' first row, which must be that step's first row (and its
    /// shuffle window's).
    pub fn push_as(&mut self, batch: RecordBatch, version: u64) -> Result<()> {
        if version != self.version {
            let step = self.rows / self.placement.step_rows();
            let mut versions = self.shared.versions();
            versions.retain(|&(first, _)| first < step);
            versions.push((step, version));
            // Versions of steps every rank has been given are not needed again.
            let done = versions.partition_point(|&(first, _)| first <= self.shared.steps_cut());
            versions.drain(..done.saturating_sub(1));
            drop(versions);
            self.version = version;
        }
        self.rows += batch.num_rows() as u64;
        self.send(Message::Rows(batch))
    }

    /// Ends the stream: its last step is padded (or dropped, as the placement says) once
    /// the rows before it are delivered. Returns the rows dropped.
    pub fn end(&mut self) -> Result<u64> {
        self.send(Message::End)?;
        self.tx = None;
        let rows = self.rows;
        let placement = &self.placement;
        Ok(rows - rows.min(placement.steps(rows).saturating_mul(placement.step_rows())))
    }

    /// Hands `message` to worker 0, starting the dataflow first if needed.
    fn send(&mut self, message: Message) -> Result<()> {
        if let Some(start) = self.start.take() {
            self.tx = Some(self.spawn(start)?);
        }
        let stopped = || {
            let why = (self.errors.get()).unwrap_or_else(|| "it was stopped".into());
            Error::Dataflow(format!("the dataflow delivering pushed rows ended: {why}"))
        };
        let Some(tx) = &self.tx else {
            return Err(stopped());
        };
        match tx.try_send(message) {
            Ok(()) => Ok(()),
            // Full: the ranks are behind. Waiting here is the producer's backpressure.
            Err(TrySendError::Full(message)) => tx.send(message).map_err(|_| stopped()),
            Err(TrySendError::Disconnected(_)) => Err(stopped()),
        }
    }

    /// Starts the dataflow on a thread of its own; returns the channel into worker 0.
    fn spawn(&self, start: Delivering) -> Result<SyncSender<Message>> {
        let (tx, rx) = sync_channel(CHANNEL);
        let rx = Mutex::new(Some(rx));
        let (shared, placement) = (self.shared.clone(), self.placement);
        let errors = start.errors.clone();
        let cluster = Cluster::local(start.workers.max(1));
        let stop = start.channels.stop.clone();
        let start = Arc::new(start);
        std::thread::Builder::new()
            .name("hydrant-pushed".into())
            .spawn(move || {
                let work = move |worker: &mut Worker| {
                    let rx = rx.lock().ok().and_then(|mut rx| rx.take());
                    run_worker(worker, placement, &shared, &start, rx);
                    Ok(())
                };
                // A failure is in `errors`, where the ranks' streams and the next push
                // find it; the log says it once (a stream let go at a stop is not news).
                if let Err(e) = supervise(&cluster, &errors, None, || {}, work)
                    && !stop.is_cancelled()
                {
                    hydrant_operators::log_line!(
                        "hydrant: the dataflow delivering pushed rows failed: {e}"
                    );
                }
            })
            .map_err(|e| Error::Dataflow(format!("cannot start a thread: {e}")))?;
        Ok(tx)
    }
}

/// One worker of the dataflow: worker 0 takes the rows and places them; the worker owning
/// a rank assembles its steps and hands them to the rank's queue.
fn run_worker(
    worker: &mut Worker,
    placement: Placement,
    shared: &Arc<Shared>,
    start: &Delivering,
    rx: Option<Receiver<Message>>,
) {
    let (index, world) = (worker.index(), placement.world_size());
    let ownership = Ownership {
        world_size: world,
        processes: 1,
        workers: worker.peers(),
    };
    let mine: Vec<usize> = (0..world)
        .filter(|&r| ownership.worker(r) == index)
        .collect();
    let first_step = shared.steps_cut();
    let owning = Owning::Stream {
        placement,
        start_step: first_step,
        end: shared.end.clone(),
    };
    let mut input = PiecesIn::new();
    let probe = ProbeHandle::new();
    let (shared2, channels, errors) =
        (shared.clone(), start.channels.clone(), start.errors.clone());
    worker.dataflow::<u64, _, _>(|scope| {
        let pieces = scope
            .input_from(&mut input)
            .exchange(move |p: &Piece| ownership.worker(p.rank) as u64);
        let steps = own(
            pieces,
            owning,
            None,
            mine,
            start.output.clone(),
            start.state_version,
            errors.clone(),
        );
        steps
            .unary::<CapacityContainerBuilder<Vec<()>>, _, _, _>(Pipeline, "Sink", move |_, _| {
                let mut failed = false;
                move |input, _output| {
                    let _running = hydrant_operators::running::enter("sink");
                    input.for_each(|_, data| {
                        for mut rb in data.drain(..) {
                            if failed {
                                continue;
                            }
                            stamp(&shared2, &placement, &mut rb);
                            if let Err(e) = channels.send(rb) {
                                errors.set("sink", e);
                                failed = true;
                            }
                        }
                    })
                }
            })
            .probe_with(&probe);
    });
    if let Some(rx) = rx {
        take_rows(worker, placement, shared, start, rx, &mut input);
    }
    drop(input);
    while !probe.done() {
        worker.step_or_park(Some(PARK));
        fate::abandon_if_failed();
    }
}

/// Worker 0's loop: takes the rows from the channel, holds them until their shuffle window
/// is full (its order is fixed only then), places them and sends each rank's pieces on.
/// Ends at the stream's end (telling owners its rows) or, abandoned, when the channel
/// closes or the dataflow fails.
fn take_rows(
    worker: &mut Worker,
    placement: Placement,
    shared: &Shared,
    start: &Delivering,
    rx: Receiver<Message>,
    input: &mut PiecesIn,
) {
    let deliver_from = shared.steps_cut().saturating_mul(placement.step_rows());
    let mut rows = shared.taken.load(Ordering::SeqCst);
    let mut held = Held::default();
    let mut pieces = Vec::new();
    let ahead = placement.window().div_ceil(placement.step_rows()) + 2;
    let mut place = |first: u64, batch: &RecordBatch, total: u64, input: &mut PiecesIn| {
        split(
            &placement,
            0,
            total,
            first,
            deliver_from..u64::MAX,
            batch,
            &mut pieces,
        );
        for piece in pieces.drain(..) {
            input.send(piece);
        }
        // Each placed batch at a time of its own: moving the input on is what sends the
        // exchange's buffers to the owners now, not once they fill. (Owners hold their own
        // capabilities, and flow control is by steps given, so times mean nothing else.)
        let next = input.time() + 1;
        input.advance_to(next);
    };
    loop {
        // Owners hold at most the steps of a window and a few more.
        while rows / placement.step_rows() > shared.steps_cut().saturating_add(ahead)
            && start.errors.get().is_none()
            && !start.channels.stop.is_cancelled()
        {
            worker.step_or_park(Some(PARK));
            fate::abandon_if_failed();
        }
        if start.errors.get().is_some() {
            return;
        }
        match rx.recv_timeout(PARK) {
            Ok(Message::Rows(batch)) => {
                let first = rows;
                rows += batch.num_rows() as u64;
                shared.taken.store(rows, Ordering::SeqCst);
                // Every position before `full` lies in a full window, and (when the last
                // step is dropped) in windows wholly before the step still filling: a
                // rank's rows of that step must not go out before the stream says
                // whether the step is delivered at all.
                let full = match placement.last_batch() {
                    LastBatch::Pad => placement.window_start(rows),
                    LastBatch::Drop => placement.window_start(rows - rows % placement.step_rows()),
                };
                let placed = held.push(first, batch).and_then(|()| {
                    held.take_before(full, |first, batch| place(first, &batch, u64::MAX, input))
                });
                if let Err(e) = placed {
                    start.errors.set("pushed", e);
                    return;
                }
            }
            Ok(Message::End) => {
                // Before the last rows go: an owner that gets them knows the end.
                let _ = shared.end.set(rows);
                let placed =
                    held.take_before(u64::MAX, |first, batch| place(first, &batch, rows, input));
                if let Err(e) = placed {
                    start.errors.set("pushed", e);
                }
                return;
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        worker.step();
        fate::abandon_if_failed();
    }
}

/// Stamps a step with the state version of its rows and the positions they were drawn
/// from, and counts it as given to its rank.
fn stamp(shared: &Shared, placement: &Placement, rb: &mut RankBatch) {
    let (step, rank) = (rb.meta.step, rb.meta.rank);
    let versions = shared.versions();
    let since = versions.partition_point(|&(first, _)| first <= step);
    if let Some(&(_, version)) = versions.get(since.wrapping_sub(1)) {
        rb.meta.state_version = version;
    }
    drop(versions);
    let rows = shared.taken.load(Ordering::SeqCst);
    let span = placement.positions(step, rank);
    rb.meta.positions = Some([span.start.min(rows), span.end.min(rows)]);
    shared.next[rank].fetch_max(step + 1, Ordering::SeqCst);
    let cut = shared.next.iter().map(|n| n.load(Ordering::SeqCst)).min();
    shared.steps_cut.raise(cut.unwrap_or(0));
}

#[cfg(test)]
mod tests {
    use arrow::array::AsArray;
    use arrow::datatypes::UInt64Type;
    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::delivery::assemble_tests::{rows, schema};

    /// Rows of the test schema, with state version 1, to `senders` by `workers` workers.
    fn to(
        senders: Vec<Option<tokio::sync::mpsc::Sender<RankBatch>>>,
        workers: usize,
    ) -> Delivering {
        Delivering {
            output: Arc::new(schema()),
            state_version: 1,
            channels: Channels {
                senders,
                stop: CancellationToken::new(),
            },
            errors: ErrorSlot::default(),
            workers,
        }
    }

    /// Every rank batch of a stream delivered from `step` on by `workers` workers, in
    /// (step, rank) order, after `push` fed it; ended unless `abandon`.
    fn deliver(
        placement: Placement,
        step: u64,
        workers: usize,
        abandon: bool,
        push: impl FnOnce(&mut PushedRows),
    ) -> Vec<RankBatch> {
        let world = placement.world_size();
        let (senders, receivers): (Vec<_>, Vec<_>) = (0..world)
            .map(|_| {
                let (tx, rx) = tokio::sync::mpsc::channel(1024);
                (Some(tx), rx)
            })
            .unzip();
        let mut out = PushedRows::new(placement, step, StepsCut::default(), to(senders, workers));
        push(&mut out);
        if !abandon {
            out.end().unwrap();
        }
        drop(out);
        let mut got = Vec::new();
        for mut rx in receivers {
            while let Some(rb) = rx.blocking_recv() {
                got.push(rb);
            }
        }
        got.sort_by_key(|rb| (rb.meta.step, rb.meta.rank));
        got
    }

    fn ids(batches: &[RankBatch]) -> Vec<u64> {
        let mut ids: Vec<u64> = batches
            .iter()
            .flat_map(|rb| {
                rb.data()
                    .column(0)
                    .as_primitive::<UInt64Type>()
                    .values()
                    .to_vec()
            })
            .filter(|&id| id != u64::MAX)
            .collect();
        ids.sort();
        ids
    }

    fn push_chunks(out: &mut PushedRows, first: u64, end: u64, chunk: u64) {
        let mut at = first;
        while at < end {
            let n = chunk.min(end - at);
            out.push_as(rows(at, n as usize), 1).unwrap();
            at += n;
        }
    }

    /// The count of steps given only grows, and a task waiting for a step wakes when
    /// another thread gives it.
    #[test]
    fn steps_cut_only_grows_and_wakes_who_waits_for_it() {
        let cut = StepsCut::default();
        let mut seen = cut.watch();
        cut.raise(3);
        cut.raise(2);
        assert_eq!(cut.get(), 3);
        let giver = cut.clone();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let thread = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(50));
            giver.raise(5);
        });
        let waited = rt.block_on(async {
            let given = seen.wait_for(|&c| c >= 5);
            let within = std::time::Duration::from_secs(10);
            tokio::time::timeout(within, given)
                .await
                .map(|r| r.map(|c| *c))
        });
        assert_eq!(waited.unwrap().unwrap(), 5);
        thread.join().unwrap();
        cut.set(1);
        assert_eq!(cut.get(), 1, "a stream started anew starts its count anew");
    }

    #[test]
    fn a_stream_pads_its_last_step_when_it_ends() {
        let placement = Placement::new(2, 4, LastBatch::Pad, 0, Some(5)).unwrap();
        let out = deliver(placement, 0, 1, false, |o| push_chunks(o, 0, 21, 7));
        assert_eq!(out.len(), 6);
        assert_eq!(ids(&out), (0..21).collect::<Vec<_>>());
        assert_eq!(out.iter().map(|rb| rb.meta.padded_rows).sum::<usize>(), 3);
        // Each batch names the positions its rows came from (row ids are positions here):
        // the windows of 5 holding its output indices, cut at the 21 rows there are.
        for rb in &out {
            let [first, end] = rb.meta.positions.unwrap();
            let ids = rb.data().column(0).as_primitive::<UInt64Type>();
            for &id in ids.values().iter().filter(|&&id| id != u64::MAX) {
                assert!((first..end).contains(&id), "{id} outside {first}..{end}");
            }
            assert_eq!(first % 5, 0);
            assert!(end % 5 == 0 || end == 21, "{end}");
        }
        let last = out.last().unwrap().meta;
        assert_eq!(
            (last.step, last.rank, last.positions),
            (2, 1, Some([20, 21]))
        );
    }

    #[test]
    fn an_abandoned_stream_delivers_its_complete_steps_and_ends() {
        let placement = Placement::new(2, 4, LastBatch::Pad, 0, Some(5)).unwrap();
        let out = deliver(placement, 0, 2, true, |o| push_chunks(o, 0, 21, 7));
        // 20 rows in full windows: two full steps of 8, and rank 0's part of the third.
        let got: Vec<_> = out.iter().map(|rb| (rb.meta.step, rb.meta.rank)).collect();
        assert_eq!(got, [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0)]);
        assert!(out.iter().all(|rb| rb.meta.padded_rows == 0));
    }

    #[test]
    fn an_unshuffled_stream_names_exactly_its_rows_positions() {
        let placement = Placement::new(2, 4, LastBatch::Pad, 0, None).unwrap();
        let out = deliver(placement, 0, 1, false, |o| push_chunks(o, 0, 13, 13));
        let got: Vec<_> = out
            .iter()
            .map(|rb| (rb.meta.step, rb.meta.rank, rb.meta.positions.unwrap()))
            .collect();
        let want = [
            (0, 0, [0, 4]),
            (0, 1, [4, 8]),
            (1, 0, [8, 12]),
            (1, 1, [12, 13]),
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn any_number_of_workers_delivers_the_same_batches() {
        for (last, window) in [(LastBatch::Pad, Some(12)), (LastBatch::Drop, None)] {
            let placement = Placement::new(3, 4, last, 7, window).unwrap();
            let one = deliver(placement, 0, 1, false, |o| push_chunks(o, 0, 100, 9));
            // 100 rows are 8 full steps of 3 x 4 and 4 rows more: all of rank 0's part of
            // a ninth step, which only the end can say is dropped.
            let steps = if last == LastBatch::Pad { 9 } else { 8 };
            assert_eq!(one.len(), 3 * steps, "{last:?}");
            for workers in [2, 3, 4] {
                let many = deliver(placement, 0, workers, false, |o| push_chunks(o, 0, 100, 9));
                assert_eq!(many.len(), one.len(), "{workers} workers");
                for (a, b) in many.iter().zip(&one) {
                    assert_eq!(a.meta, b.meta);
                    assert_eq!(a.data(), b.data());
                }
            }
        }
    }

    /// Rows pushed one at a time (held joined, see `held.rs`) are delivered as the same
    /// batches as rows pushed in chunks.
    #[test]
    fn rows_pushed_one_at_a_time_are_delivered_as_rows_pushed_in_chunks() {
        let placement = Placement::new(2, 100, LastBatch::Pad, 7, Some(3000)).unwrap();
        let chunks = deliver(placement, 0, 2, false, |o| push_chunks(o, 0, 7001, 1500));
        let ones = deliver(placement, 0, 2, false, |o| push_chunks(o, 0, 7001, 1));
        assert_eq!(ids(&ones), (0..7001).collect::<Vec<_>>());
        assert_eq!(ones.len(), chunks.len());
        for (a, b) in ones.iter().zip(&chunks) {
            assert_eq!(a.meta, b.meta);
            assert_eq!(a.data(), b.data());
        }
    }

    #[test]
    fn a_stream_resumed_at_a_step_delivers_the_same_steps_from_there() {
        let placement = Placement::new(2, 4, LastBatch::Pad, 3, Some(5)).unwrap();
        let whole = deliver(placement, 0, 1, false, |o| push_chunks(o, 0, 61, 7));
        assert_eq!(whole.last().map(|rb| rb.meta.step), Some(7));
        // Step 3 starts at position 24, in the window of positions 20..25.
        assert_eq!(placement.stream().stream_start(3), 20);
        let resumed = deliver(placement, 3, 2, false, |o| push_chunks(o, 20, 61, 6));
        let want: Vec<_> = whole.iter().filter(|rb| rb.meta.step >= 3).collect();
        assert_eq!(resumed.len(), want.len());
        for (got, want) in resumed.iter().zip(want) {
            assert_eq!(got.meta, want.meta);
            assert_eq!(got.data(), want.data());
        }
    }

    #[test]
    fn each_step_carries_the_state_version_of_its_rows() {
        let placement = Placement::new(2, 4, LastBatch::Pad, 0, None).unwrap();
        let out = deliver(placement, 0, 2, false, |o| {
            o.push_as(rows(0, 8), 1).unwrap();
            o.push_as(rows(8, 16), 2).unwrap();
            o.push_as(rows(24, 4), 3).unwrap();
        });
        let got: Vec<_> = out
            .iter()
            .map(|rb| (rb.meta.step, rb.meta.state_version))
            .collect();
        let want = [
            (0, 1),
            (0, 1),
            (1, 2),
            (1, 2),
            (2, 2),
            (2, 2),
            (3, 3),
            (3, 3),
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn a_push_after_the_dataflow_failed_is_refused_with_its_reason() {
        let placement = Placement::new(1, 4, LastBatch::Pad, 0, None).unwrap();
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        drop(rx);
        let mut out = PushedRows::new(placement, 0, StepsCut::default(), to(vec![Some(tx)], 1));
        let mut refused = None;
        for k in 0..1000 {
            if let Err(e) = out.push_as(rows(k * 4, 4), 1) {
                refused = Some(e.to_string());
                break;
            }
        }
        let refused = refused.expect("pushes into a closed queue went on being taken");
        assert!(refused.contains("rank 0"), "{refused}");
    }
}
