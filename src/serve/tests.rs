//! Runs and their consumers without a dataflow: batches fed by hand.

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::Schema;
use futures::StreamExt;
use hydrant_flight::RankStream;
use tokio::sync::mpsc::Sender;

use super::run::Run;
use super::stream::{ABSENT_AFTER, Consumer, LetGo, Runs, let_unread_go};
use crate::delivery::{RankBatch, StepMeta};

fn step(step: u64) -> RankBatch {
    RankBatch {
        meta: StepMeta::at_step(step),
        batch: hydrant_operators::Batch {
            seq: step,
            data: RecordBatch::new_empty(Arc::new(Schema::empty())),
        },
    }
}

/// A run of one rank in an epoch of `len` steps, and the sender of its queue.
fn run(len: u64) -> (Sender<RankBatch>, Arc<Run>) {
    let (senders, run) = Run::new(
        0,
        0,
        None,
        0..1,
        Some(len),
        super::REPLAY_BYTES,
        Arc::from([]),
    );
    (senders.into_iter().flatten().next().unwrap(), run)
}

fn consumer(run: &Arc<Run>, start_step: u64) -> RankStream {
    let attached = run.attach(0, start_step, true).unwrap();
    Consumer::new(
        run.clone(),
        Default::default(),
        0,
        start_step,
        attached,
        None,
        LetGo {
            after: ABSENT_AFTER,
            peers: None,
        },
    )
    .into_stream()
}

/// Feeds `steps` (the queue is bounded: the stream's reads make room), then ends it.
fn feed(tx: Sender<RankBatch>, steps: &[u64]) {
    let steps = steps.to_vec();
    tokio::spawn(async move {
        for s in steps {
            tx.send(step(s)).await.unwrap();
        }
    });
}

async fn steps_of(s: RankStream) -> Vec<Result<u64, String>> {
    s.map(|b| b.map(|(m, _)| m.step).map_err(|e| e.to_string()))
        .collect()
        .await
}

#[tokio::test]
async fn a_stream_that_skips_or_ends_short_says_where_to_resume() {
    let (tx, r) = run(3);
    feed(tx, &[0, 2]);
    let got = steps_of(consumer(&r, 0)).await;
    assert_eq!(got[0], Ok(0));
    let err = got[1].clone().unwrap_err();
    assert!(
        err.contains("skipped from step 1 to 2") && err.contains("start_step 1"),
        "{err}"
    );
    assert_eq!(got.len(), 2);

    let (tx, r) = run(3);
    feed(tx, &[0, 1]);
    let got = steps_of(consumer(&r, 0)).await;
    let err = got[2].clone().unwrap_err();
    assert!(
        err.contains("ended at step 2 of 3") && err.contains("start_step 2"),
        "{err}"
    );

    let (tx, r) = run(3);
    feed(tx, &[0, 1, 2]);
    let s = consumer(&r, 0);
    let got: Vec<_> = s.map(|b| b.unwrap().0).collect().await;
    assert_eq!(got.iter().map(|m| m.step).collect::<Vec<_>>(), [0, 1, 2]);
    assert_eq!(
        got.iter().map(|m| m.last).collect::<Vec<_>>(),
        [false, false, true]
    );
}

#[tokio::test]
async fn a_new_reader_supersedes_a_waiting_one_and_gets_every_step_once() {
    let (tx, r) = run(6);
    let mut first = consumer(&r, 0);
    tx.send(step(0)).await.unwrap();
    tx.send(step(1)).await.unwrap();
    assert_eq!(first.next().await.unwrap().unwrap().0.step, 0);
    // The first stream waits on the queue when the second takes the rank from step 1
    // (step 0 was sent but not finished, say).
    let waiting = tokio::spawn(async move {
        let a = first.next().await.unwrap().map(|b| b.0.step);
        let b = first.next().await.unwrap().map(|b| b.0.step);
        (a, b)
    });
    tokio::task::yield_now().await;
    let second = consumer(&r, 1);
    feed(tx, &[2, 3, 4, 5]);
    let got = steps_of(second).await;
    let (a, b) = waiting.await.unwrap();
    // The first may have sent step 1 before it was superseded; never anything after.
    let aborted = |x: &Result<u64, _>| {
        x.as_ref()
            .is_err_and(|e: &hydrant_flight::ServeError| e.to_string().contains("superseded"))
    };
    assert!(
        matches!(a, Ok(1)) && aborted(&b) || aborted(&a),
        "{a:?} {b:?}"
    );
    assert_eq!(got, (1..6).map(Ok).collect::<Vec<_>>());
}

#[tokio::test]
async fn a_drain_keeps_the_queue_moving_and_hands_over_to_a_reader() {
    let (tx, r) = run(8);
    let attached = r.attach(0, u64::MAX, false).unwrap();
    Consumer::new(
        r.clone(),
        Default::default(),
        0,
        u64::MAX,
        attached,
        None,
        LetGo {
            after: ABSENT_AFTER,
            peers: None,
        },
    )
    .drain();
    for s in 0..4 {
        tx.send(step(s)).await.unwrap();
    }
    // Steps 0..4 went through the drain (the bounded queue took them all).
    while r.slot(0).next_step < 3 {
        tokio::task::yield_now().await;
    }
    // Drained steps are kept for replay as sent ones are (pushed input has them nowhere
    // else): a reader that comes for them gets them, then the rest.
    let reader = consumer(&r, 0);
    feed(tx, &(4..8).collect::<Vec<_>>());
    let got = steps_of(reader).await;
    assert_eq!(got, (0..8).map(Ok).collect::<Vec<_>>());
}

#[tokio::test]
async fn a_waiting_reader_lets_go_of_unread_ranks_of_its_epoch_and_before() {
    let shared = |epoch, only| {
        Run::new(
            epoch,
            0,
            only,
            0..2,
            Some(8),
            super::REPLAY_BYTES,
            Arc::from([]),
        )
    };
    let ((feeds0, r0), (feeds1, r1), (_, r2)) = (shared(0, None), shared(1, None), shared(2, None));
    let (_, catching_up) = shared(0, Some(1));
    let runs: Arc<Runs> = Arc::new(std::sync::Mutex::new(vec![
        r0.clone(),
        r1.clone(),
        r2.clone(),
        catching_up.clone(),
    ]));
    // Rank 0 of epoch 1 has a reader; it waits.
    let reader = r1.attach(0, 0, true).unwrap();
    let_unread_go(&Arc::downgrade(&runs), 1, "a test waited");

    // Let go: both ranks of epoch 0 and rank 1 of epoch 1; their bounded queues take a
    // whole epoch.
    for (feeds, rank) in [(&feeds0, 0), (&feeds0, 1), (&feeds1, 1)] {
        let tx = feeds[rank].clone().unwrap();
        let all = async {
            for s in 0..8 {
                tx.send(step(s)).await.unwrap();
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(5), all)
            .await
            .expect("a rank let go takes its whole epoch");
    }
    // Kept: the rank read, a later epoch's ranks, and a rank catching up on its own run.
    assert_eq!(r1.slot(0).generation, reader.generation);
    assert!(r2.drain_if_unread(0).is_some() && r2.drain_if_unread(1).is_some());
    assert!(catching_up.drain_if_unread(1).is_some());
}

/// A run that could not read its input for want of file descriptors or memory is told as
/// such (UNAVAILABLE: a retry can work), by the OS error std's text ends with.
#[test]
fn running_out_of_descriptors_or_memory_is_told_apart_from_bad_input() {
    use super::run::out_of_resources;
    assert!(out_of_resources(
        "source: input a.parquet: Parquet argument error: External: Too many open files (os error 24)"
    ));
    assert!(out_of_resources("Cannot allocate memory (os error 12)"));
    assert!(out_of_resources(
        "Too many open files in system (os error 23)"
    ));
    assert!(!out_of_resources("No such file or directory (os error 2)"));
    assert!(!out_of_resources("(os error 240)"));
    assert!(!out_of_resources("is 10 bytes, 20 when it was opened"));
}
