//! Which operator a worker thread is running: a panic hook names it in its one line (a
//! panic inside timely's own code between operators names none). Also a fail point, so
//! that tests can make any operator panic in a real process: set `HYDRANT_FAIL_POINT` to
//! an operator's name (`source`, `featurize`, `place`, `own`, `sink`, `fit`), to panic
//! there in every worker, or to `NAME:W:N`, to panic only in worker `W` (the thread
//! `timely:work-W`), the `N`-th time it enters the operator (from 0): one worker failing
//! mid-run while the others go on.

use std::cell::Cell;
use std::sync::OnceLock;

/// The environment variable that names an operator to panic in (tests only).
pub const FAIL_POINT_ENV: &str = "HYDRANT_FAIL_POINT";

thread_local! {
    static CURRENT: Cell<Option<&'static str>> = const { Cell::new(None) };
    /// Times this thread entered the fail point's operator.
    static ENTERED: Cell<u64> = const { Cell::new(0) };
}

/// Writes one line to stderr, as `eprintln!` does, except that a failure to write is
/// ignored: `eprintln!` panics when stderr is a pipe no one reads any more (a supervisor's
/// log collector that went away), and a server that panics there could neither go on
/// serving nor stop on SIGTERM (its signal task died printing "shutting down").
#[macro_export]
macro_rules! log_line {
    ($($arg:tt)*) => {
        $crate::running::write_line(::std::format_args!($($arg)*))
    };
}

/// What [`log_line!`] calls.
#[doc(hidden)]
pub fn write_line(line: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// Marks this thread as running operator `name` until the guard is dropped.
#[must_use = "the operator is marked only while the guard lives"]
pub struct Running {
    previous: Option<&'static str>,
}

/// Enters operator `name` (and panics there if the fail point names it).
pub fn enter(name: &'static str) -> Running {
    let previous = CURRENT.replace(Some(name));
    if let Some(point) = fail_point()
        && point.name == name
        && point.fires()
    {
        panic!("failure injected by {FAIL_POINT_ENV}={name}");
    }
    Running { previous }
}

impl Drop for Running {
    fn drop(&mut self) {
        CURRENT.set(self.previous);
    }
}

/// The operator this thread is running, if it is inside one.
pub fn current() -> Option<&'static str> {
    CURRENT.get()
}

/// A panic's message, as `panic!` gives it (a `String` or a `&str`), for hooks that say it
/// in one line.
pub fn panic_message<'a>(info: &'a std::panic::PanicHookInfo<'_>) -> &'a str {
    let payload = info.payload();
    payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| payload.downcast_ref::<&str>().copied())
        .unwrap_or("a panic")
}

/// Where `HYDRANT_FAIL_POINT` says to panic.
struct FailPoint {
    name: String,
    /// Only in this worker, the `n`-th time (otherwise in every worker, every time).
    worker: Option<(String, u64)>,
}

impl FailPoint {
    /// `NAME` or `NAME:W:N`; `None` for anything else.
    fn parse(text: &str) -> Option<Self> {
        let mut parts = text.split(':');
        let name = parts.next()?.to_string();
        let worker = match (parts.next(), parts.next(), parts.next()) {
            (None, _, _) => None,
            (Some(w), Some(n), None) => {
                let w: usize = w.parse().ok()?;
                Some((format!("timely:work-{w}"), n.parse().ok()?))
            }
            _ => return None,
        };
        Some(FailPoint { name, worker })
    }

    /// Whether this entry into the operator is the one to panic at.
    fn fires(&self) -> bool {
        let Some((thread, n)) = &self.worker else {
            return true;
        };
        if std::thread::current().name() != Some(thread.as_str()) {
            return false;
        }
        let entered = ENTERED.get();
        ENTERED.set(entered + 1);
        entered == *n
    }
}

fn fail_point() -> Option<&'static FailPoint> {
    static POINT: OnceLock<Option<FailPoint>> = OnceLock::new();
    POINT
        .get_or_init(|| {
            std::env::var(FAIL_POINT_ENV)
                .ok()
                .and_then(|v| FailPoint::parse(&v))
        })
        .as_ref()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guards_nest_and_restore() {
        assert_eq!(current(), None);
        {
            let _a = enter("a");
            assert_eq!(current(), Some("a"));
            {
                let _b = enter("b");
                assert_eq!(current(), Some("b"));
            }
            assert_eq!(current(), Some("a"));
        }
        assert_eq!(current(), None);
    }

    /// `NAME` fires in every worker, every time; `NAME:W:N` only in worker W's N-th entry.
    #[test]
    fn a_fail_point_names_an_operator_and_maybe_one_worker_and_entry() {
        let every = FailPoint::parse("source").unwrap();
        assert!(every.worker.is_none() && every.fires() && every.fires());
        let one = FailPoint::parse("own:1:2").unwrap();
        assert_eq!(one.name, "own");
        let fired = std::thread::Builder::new()
            .name("timely:work-1".into())
            .spawn(move || (0..4).map(|_| one.fires()).collect::<Vec<_>>())
            .unwrap()
            .join()
            .unwrap();
        assert_eq!(fired, [false, false, true, false]);
        // On another thread it never fires.
        assert!(!FailPoint::parse("own:1:0").unwrap().fires());
        for bad in ["own:1", "own:x:2", "own:1:2:3"] {
            assert!(FailPoint::parse(bad).is_none(), "{bad}");
        }
    }
}
