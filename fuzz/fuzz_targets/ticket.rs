//! Tickets are bytes from any client: parsing never panics, and a ticket that parses
//! writes bytes that parse back to it.
#![no_main]

use hydrant_flight::Ticket;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match Ticket::parse(data) {
        Ok(t) => {
            assert!(t.rank < t.world_size);
            assert_eq!(
                Ticket::parse(&t.to_bytes()).expect("written tickets parse"),
                t
            );
        }
        Err(e) => assert!(!e.to_string().contains('\n'), "one line: {e}"),
    }
});
