//! Arrow IPC files are bytes from anyone: opening one (its footer, and each record batch's
//! message header for its row count, parsed by hydrant) never panics, an error is one line
//! naming the file, and a file that opens numbers its rows without gaps.
//!
//! Only opening is fuzzed: reading a batch's body is arrow's decoder, behind the same
//! checks as every other input.
#![no_main]

use hydrant::source::Inputs;
use libfuzzer_sys::fuzz_target;

mod input_file;
use input_file::{one_line_naming_the_file, scratch};

fuzz_target!(|data: &[u8]| {
    // Other bytes are not opened as an IPC file (`parquet_file` takes Parquet files).
    if !data.starts_with(b"ARROW1") {
        return;
    }
    let path = scratch("arrow");
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
        Err(e) => one_line_naming_the_file(e),
    }
});
