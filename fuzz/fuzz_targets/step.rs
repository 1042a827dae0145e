//! Step arguments (`clip(-3, 3)`, `hash_bucket(1000)`) from pipeline files: parsing never
//! panics, and a step that parses prints as text that parses back to it.
#![no_main]

use hydrant::operators::Step;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    match Step::parse(text) {
        Ok(step) => {
            let printed = step.to_string();
            let back = Step::parse(&printed).unwrap_or_else(|e| panic!("{printed:?}: {e}"));
            assert_eq!(back, step, "{printed:?}");
        }
        Err(e) => assert!(!e.to_string().contains('\n'), "one line: {e}"),
    }
});
