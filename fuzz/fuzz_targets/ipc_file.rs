//! Arrow IPC files are bytes from anyone: opening one (its footer, and each record batch's
//! message header for its row count, parsed by hydrant) never panics, an error is one line
//! naming the file, and a file that opens numbers its rows without gaps.
//!
//! Only opening is fuzzed: reading a batch's body is arrow's decoder, behind the same
//! checks as every other input.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use hydrant::source::Inputs;
use libfuzzer_sys::fuzz_target;

/// One scratch file per fuzzing process, rewritten for every input.
fn scratch() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        std::env::temp_dir().join(format!("hydrant-fuzz-{}.arrow", std::process::id()))
    })
}

fuzz_target!(|data: &[u8]| {
    // Other bytes are not opened as an IPC file (the Parquet reader is not fuzzed here).
    if !data.starts_with(b"ARROW1") {
        return;
    }
    let path = scratch();
    std::fs::write(path, data).expect("the scratch file is writable");
    match Inputs::open(std::slice::from_ref(path), 1024) {
        Ok(inputs) => {
            let mut next = 0;
            for unit in inputs.units() {
                assert_eq!(unit.first_row, next, "rows are numbered without gaps");
                assert!(unit.rows > 0, "a unit holds rows");
                next += unit.rows;
            }
        }
        Err(e) => {
            let e = e.to_string();
            assert!(!e.contains('\n'), "one line: {e}");
            assert!(e.contains("hydrant-fuzz-"), "names the file: {e}");
        }
    }
});
