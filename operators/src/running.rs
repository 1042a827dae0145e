//! Which operator a worker thread is running: a panic hook names it in its one line (a
//! panic inside timely's own code between operators names none). Also a fail point, so
//! that tests can make any operator panic in a real process: set `HYDRANT_FAIL_POINT` to
//! an operator's name (`source`, `featurize`, `place`, `own`, `sink`, `fit`).

use std::cell::Cell;
use std::sync::OnceLock;

/// The environment variable that names an operator to panic in (tests only).
pub const FAIL_POINT_ENV: &str = "HYDRANT_FAIL_POINT";

thread_local! {
    static CURRENT: Cell<Option<&'static str>> = const { Cell::new(None) };
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
    if fail_point() == Some(name) {
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

fn fail_point() -> Option<&'static str> {
    static POINT: OnceLock<Option<String>> = OnceLock::new();
    POINT
        .get_or_init(|| std::env::var(FAIL_POINT_ENV).ok())
        .as_deref()
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
}
