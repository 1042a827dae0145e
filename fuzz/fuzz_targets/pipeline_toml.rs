//! Pipeline files: parsing and checking never panic, errors are one line, and a pipeline
//! that parses compiles (or is refused) against the schema it implies.
#![no_main]

use hydrant::PipelineSpec;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    match PipelineSpec::from_toml(text, "fuzz.toml") {
        Ok(spec) => {
            if let Err(e) = spec.plan(&spec.nominal_schema()) {
                assert!(!e.to_string().contains('\n'), "one line: {e}");
            }
        }
        Err(e) => assert!(!e.to_string().contains('\n'), "one line: {e}"),
    }
});
