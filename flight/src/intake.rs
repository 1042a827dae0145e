//! How many pushed batches a server holds at once, whatever the number of producers.
//!
//! A DoPut's next message is read off its stream only while the push holds one of a few
//! places, and the place is kept until the batch is admitted (which waits for queue space
//! while the trainers do not read). Producers past those places are not read from at
//! all: HTTP/2 flow control holds their bytes on their side. Before, every DoPut read
//! its next message at once and held it, decoded, while it waited to be admitted: 48
//! producers of 31 MiB batches took the server to 3 GB (found by a hostile run).
//!
//! A place is held only while a message is coming in: a push whose producer sends nothing
//! for [`SLICE`] gives its place to the next push waiting (places are taken in turn), so an
//! idle producer holds up no one; what it had sent of a message so far stays read.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, Stream, StreamExt};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::check::Guarded;

/// Pushed batches held at once (read, decoded, being admitted): with `--max-message-bytes`
/// of 64 MiB, a few hundred MiB at most.
pub const PUSHES_HELD: usize = 4;

/// How long a push may hold a place while its next message has not come in whole.
pub const SLICE: Duration = Duration::from_secs(1);

/// The places pushes take turns at (see the module).
#[derive(Clone)]
pub(crate) struct Intake {
    places: Arc<Semaphore>,
}

impl Intake {
    /// An intake of `places` places.
    pub(crate) fn new(places: usize) -> Self {
        Intake {
            places: Arc::new(Semaphore::new(places)),
        }
    }

    /// The next item of `stream`, read while holding a place, and the place: keep it until
    /// the item is dealt with. A panic while polling `stream` (arrow's decoder on a
    /// malformed message) is caught and returned as `Err`.
    pub(crate) async fn next<S: Stream + Unpin>(
        &self,
        stream: &mut S,
    ) -> (std::thread::Result<Option<S::Item>>, OwnedSemaphorePermit) {
        loop {
            let place = Arc::clone(&self.places)
                .acquire_owned()
                .await
                .expect("the intake's semaphore is never closed");
            // `next` is cancel-safe: a message cut by the slice goes on where it was.
            let next = Guarded(AssertUnwindSafe(stream.next())).catch_unwind();
            if let Ok(next) = tokio::time::timeout(SLICE, next).await {
                return (next, place);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// An idle stream holds its place for a slice at a time: another stream's item is
    /// read meanwhile, with one place between them; and a held place keeps others out.
    #[tokio::test]
    async fn an_idle_stream_gives_its_place_up_and_a_held_place_is_kept() {
        let intake = Intake::new(1);
        let idle = tokio::spawn({
            let intake = intake.clone();
            async move {
                let mut never = futures::stream::pending::<u32>();
                intake.next(&mut never).await.0.ok().flatten()
            }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        let started = Instant::now();
        let mut busy = futures::stream::iter([7u32]);
        let (item, place) = intake.next(&mut busy).await;
        assert_eq!(item.ok().flatten(), Some(7));
        assert!(started.elapsed() < SLICE * 3, "{:?}", started.elapsed());
        // Held: the next stream waits for it.
        let mut other = futures::stream::iter([8u32]);
        let waiting = tokio::time::timeout(SLICE * 2, intake.next(&mut other)).await;
        assert!(waiting.is_err(), "read while the only place was held");
        drop(place);
        let (item, _place) = intake.next(&mut other).await;
        assert_eq!(item.ok().flatten(), Some(8));
        idle.abort();
    }
}
