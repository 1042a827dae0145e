//! What the input-file targets (`ipc_file`, `parquet_file`) share: a scratch file to write
//! each input to, and the form every error must take.

use std::path::PathBuf;
use std::sync::OnceLock;

/// One scratch file per fuzzing process, named `hydrant-fuzz-<pid>.<extension>`, rewritten
/// for every input.
pub fn scratch(extension: &str) -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let name = format!("hydrant-fuzz-{}.{extension}", std::process::id());
        std::env::temp_dir().join(name)
    })
}

/// An error about an input file is one line, and names the file.
pub fn one_line_naming_the_file(e: impl std::fmt::Display) {
    let e = e.to_string();
    assert!(!e.contains('\n'), "one line: {e}");
    assert!(e.contains("hydrant-fuzz-"), "names the file: {e}");
}
