//! Checks a pushed IPC message before arrow decodes it. Arrow's decoder trusts a message's
//! buffer offsets and lengths: a mutated stream panicked inside it ("the offset of the new
//! Buffer cannot exceed the existing length") or asked for an allocation sized by a forged
//! row count. Every such message is refused here with a reason; what passes is then decoded
//! with arrow's validation of the arrays.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::sync::Once;
use std::task::{Context, Poll};

use arrow::ipc::{MessageHeader, root_as_message};
use arrow_flight::FlightData;

/// The most rows one pushed batch may hold.
pub const MAX_PUSH_ROWS: i64 = 1 << 24;

/// Checks one DoPut message's framing: its header is a well-formed IPC message, and every
/// buffer and node it describes lies within its body and within [`MAX_PUSH_ROWS`].
pub fn check_message(data: &FlightData) -> Result<(), String> {
    if data.data_header.is_empty() {
        // A message with only a descriptor or app metadata carries no batch.
        return if data.data_body.is_empty() {
            Ok(())
        } else {
            Err("a body without an IPC header".into())
        };
    }
    check_ipc_message(&data.data_header, data.data_body.len(), MAX_PUSH_ROWS)
}

/// Checks an IPC message (`header`: its flatbuffer; `body`: the bytes of body that came
/// with it) before arrow decodes it: a well-formed message whose buffers and nodes lie
/// within the body, of at most `max_rows` rows. Used for pushed messages and for the
/// record batches of input files, whose bytes are anyone's.
pub fn check_ipc_message(header: &[u8], body: usize, max_rows: i64) -> Result<(), String> {
    let message =
        root_as_message(header).map_err(|e| format!("IPC header is not a valid message: {e}"))?;
    let body = i64::try_from(body).unwrap_or(i64::MAX);
    if message.bodyLength() < 0 || message.bodyLength() > body {
        return Err(format!(
            "IPC header says the body is {} bytes; it is {body}",
            message.bodyLength()
        ));
    }
    let batch = match message.header_type() {
        MessageHeader::Schema | MessageHeader::NONE => return Ok(()),
        MessageHeader::RecordBatch => message.header_as_record_batch(),
        MessageHeader::DictionaryBatch => {
            message.header_as_dictionary_batch().and_then(|d| d.data())
        }
        other => return Err(format!("IPC message of type {other:?} is not a batch")),
    }
    .ok_or("IPC batch header is missing")?;
    if !(0..=max_rows).contains(&batch.length()) {
        return Err(format!(
            "a batch of {} rows (at most {max_rows})",
            batch.length()
        ));
    }
    // An array of n values takes at least n bits of body unless its type has no buffers
    // (null); a longer node could only make arrow allocate for rows that are not there.
    let most = body.saturating_mul(8).saturating_add(batch.length());
    for node in batch.nodes().iter().flatten() {
        if node.length() < 0 || node.length() > most {
            return Err(format!(
                "an array of {} values in {body} bytes",
                node.length()
            ));
        }
        if node.null_count() < 0 || node.null_count() > node.length() {
            return Err(format!(
                "an array of {} values with {} nulls",
                node.length(),
                node.null_count()
            ));
        }
    }
    for b in batch.buffers().iter().flatten() {
        if b.offset() < 0 || b.length() < 0 || b.offset().saturating_add(b.length()) > body {
            return Err(format!(
                "a buffer at bytes {}..+{} of a {body}-byte body",
                b.offset(),
                b.length()
            ));
        }
    }
    for n in batch.variadicBufferCounts().iter().flatten() {
        if n < 0 || n > body {
            return Err(format!("{n} variadic buffers in {body} bytes"));
        }
    }
    Ok(())
}

/// What a thread is decoding, for the panic hook (see [`quiet_decoder_panics`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Decoding {
    Nothing,
    /// A pushed stream: a panic is logged in one line, and the push refused.
    Pushed,
    /// An input file: a panic becomes the error [`decode_quietly`] returns, unlogged.
    Input,
}

thread_local! {
    /// What this thread is decoding now.
    static DECODING: Cell<Decoding> = const { Cell::new(Decoding::Nothing) };
    /// The message of the last panic inside [`decode_quietly`] on this thread.
    static LAST_PANIC: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// Runs `decode` (arrow's IPC decoder on pushed bytes), returning `None` if it panicked.
///
/// What [`check_message`] cannot see without the schema can still panic inside arrow: with
/// arrow-ipc 60.1, an offsets buffer whose length is not a multiple of its width fails an
/// assertion in `validate_offsets` (`prefix.is_empty() && suffix.is_empty()`). The push is
/// then refused like any other bad stream; the panic hook (see [`quiet_decoder_panics`])
/// says so in one line instead of a backtrace.
pub fn decode_guarded<T>(decode: impl FnOnce() -> T) -> Option<T> {
    let _decoding = Guard::start(Decoding::Pushed);
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(decode)).ok()
}

/// Runs `decode` (a reader of an input file: arrow's IPC decoder, parquet's), returning
/// what its panic said, if it panicked, as the error: a corrupt file is an error naming
/// it, not a panic of the thread that read it. Nothing is logged.
pub fn decode_quietly<T>(decode: impl FnOnce() -> T) -> Result<T, String> {
    quiet_decoder_panics();
    let _decoding = Guard::start(Decoding::Input);
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(decode)).map_err(|_| {
        LAST_PANIC
            .take()
            .unwrap_or_else(|| "the decoder panicked".into())
    })
}

/// Whether this thread is inside [`decode_guarded`] or [`decode_quietly`]: a panic hook
/// installed after [`quiet_decoder_panics`] hands such panics on to it.
pub fn decoding() -> bool {
    DECODING.get() != Decoding::Nothing
}

/// A future whose polls count as decoding pushed bytes (for the panic hook); the service
/// wraps its decoder's polls in it, inside `catch_unwind`.
pub struct Guarded<F>(pub F);

impl<F: Future + Unpin> Future for Guarded<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let _decoding = Guard::start(Decoding::Pushed);
        Pin::new(&mut self.0).poll(cx)
    }
}

/// Marks this thread as decoding until dropped (also when a panic unwinds past it), then
/// restores what it was doing before.
struct Guard(Decoding);

impl Guard {
    fn start(what: Decoding) -> Self {
        Guard(DECODING.replace(what))
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        DECODING.set(self.0);
    }
}

/// Installs (once) a panic hook that reports a panic inside [`decode_guarded`] in one line,
/// keeps one inside [`decode_quietly`] for its error, and passes every other panic to the
/// hook installed before.
pub fn quiet_decoder_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| match DECODING.get() {
            Decoding::Pushed => {
                let message = hydrant_operators::running::panic_message(info);
                hydrant_operators::log_line!(
                    "hydrant: a pushed stream failed arrow's IPC decoder ({message}); refused"
                );
            }
            Decoding::Input => {
                // One line, as errors are: an assertion's message spans several
                // (`left: 0` and `right: 0` under it; found by the fuzzer).
                let message = hydrant_operators::running::panic_message(info);
                let words: Vec<&str> = message.split_whitespace().collect();
                LAST_PANIC.set(Some(words.join(" ")));
            }
            Decoding::Nothing => previous(info),
        }));
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int64Array, RecordBatch, StringArray};
    use arrow_flight::encode::FlightDataEncoderBuilder;
    use futures::{StreamExt, TryStreamExt};
    use std::sync::Arc;

    fn messages() -> Vec<FlightData> {
        let batch = RecordBatch::try_from_iter([
            ("a", Arc::new(Int64Array::from(vec![1, 2, 3])) as _),
            ("s", Arc::new(StringArray::from(vec!["x", "y", "z"])) as _),
        ])
        .unwrap();
        let stream = FlightDataEncoderBuilder::new()
            .build(futures::stream::iter([Ok(batch)]))
            .boxed();
        futures::executor::block_on(stream.try_collect()).unwrap()
    }

    #[test]
    fn real_messages_pass_and_forged_ones_do_not() {
        let good = messages();
        assert!(good.iter().all(|m| check_message(m).is_ok()));
        let batch = good.last().unwrap().clone();

        let mut short = batch.clone();
        short.data_body = short.data_body.slice(..short.data_body.len() / 2);
        assert!(check_message(&short).unwrap_err().contains("body"));

        let mut junk = batch.clone();
        junk.data_header = bytes::Bytes::from_static(b"\x01\x02\x03");
        assert!(
            check_message(&junk)
                .unwrap_err()
                .contains("not a valid message")
        );

        let mut orphan = batch;
        orphan.data_header = bytes::Bytes::new();
        assert!(check_message(&orphan).is_err());
    }

    /// A panic inside `decode_quietly` is its error, with the panic's message; the thread
    /// goes on, and panics outside it still reach the hook before (here: unwinding).
    #[test]
    fn a_quiet_decode_turns_a_panic_into_its_error() {
        assert_eq!(decode_quietly(|| 7), Ok(7));
        let err = decode_quietly(|| -> u32 { panic!("offset {} past the end", 9) });
        assert_eq!(err, Err("offset 9 past the end".to_string()));
        // An assertion's message, on several lines, is one line.
        let err = decode_quietly(|| assert_ne!(0, 0, "slice must not be empty"));
        let err = err.unwrap_err();
        assert!(
            !err.contains('\n') && err.contains("slice must not be empty left: 0"),
            "{err}"
        );
        assert!(!decoding());
        let outside = std::panic::catch_unwind(|| panic!("not a decode"));
        assert!(outside.is_err());
    }
}
