//! Parquet files are bytes from anyone: opening one (its footer, kept small by hydrant) and
//! reading every row group never panics, an error is one line naming the file, a file that
//! opens numbers its rows without gaps, and a row group that reads gives the rows its
//! footer promised, numbered from its first.
#![no_main]

use arrow::array::{Array, UInt64Array};
use hydrant::source::Inputs;
use libfuzzer_sys::fuzz_target;

mod input_file;
use input_file::{one_line_naming_the_file, scratch};

fuzz_target!(|data: &[u8]| {
    // Other bytes are not opened as a Parquet file (the IPC target takes those).
    if !data.starts_with(b"PAR1") {
        return;
    }
    let path = scratch("parquet");
    std::fs::write(path, data).expect("the scratch file is writable");
    let inputs = match Inputs::open(std::slice::from_ref(path), 64) {
        Ok(inputs) => inputs,
        Err(e) => return one_line_naming_the_file(e),
    };
    let mut next = 0;
    for unit in inputs.units() {
        assert_eq!(unit.first_row, next, "rows are numbered without gaps");
        next += unit.rows;
        let batches = match inputs.read(unit) {
            Ok(batches) => batches,
            Err(e) => {
                one_line_naming_the_file(e);
                continue;
            }
        };
        let (mut row, mut failed) = (unit.first_row, false);
        for batch in batches {
            match batch {
                Ok(batch) => {
                    let ids = batch.data.column(batch.data.num_columns() - 1);
                    let ids = ids
                        .as_any()
                        .downcast_ref::<UInt64Array>()
                        .expect("row_id is last");
                    assert!(ids.values().iter().all(|&id| {
                        row += 1;
                        id == row - 1
                    }));
                }
                Err(e) => {
                    one_line_naming_the_file(e);
                    failed = true;
                    break;
                }
            }
        }
        if !failed {
            assert_eq!(row, unit.first_row + unit.rows, "the rows the footer said");
        }
    }
});
