//! Fitted state files: reading never panics, errors are one line, and a state that reads
//! writes JSON that reads back to it.
#![no_main]

use hydrant::operators::FittedState;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    match FittedState::from_json(text) {
        Ok(state) => {
            let back = FittedState::from_json(&state.to_json()).expect("written states read");
            assert_eq!(back, state);
        }
        Err(e) => assert!(!e.to_string().contains('\n'), "one line: {e}"),
    }
});
