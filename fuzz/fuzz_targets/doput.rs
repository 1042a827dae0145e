//! DoPut bytes through the server's path: each message checked as the service checks it,
//! decoded by arrow-flight (guarded, as the service does), then featurized as a pushed batch (checked against the pipeline
//! and the served schema). Nothing a producer sends may panic, and a batch that is
//! accepted keeps its row count.
//!
//! Input: messages framed as `u32 LE header length, header, u32 LE body length, body`
//! (the IPC metadata and body of a FlightData); `seeds.py` writes real ones.
#![no_main]

use std::sync::{Arc, OnceLock};

use arrow::datatypes::SchemaRef;
use arrow_flight::FlightData;
use arrow_flight::decode::FlightRecordBatchStream;
use futures::StreamExt;
use hydrant::PipelineSpec;
use hydrant::operators::{FittedParam, FittedState};
use hydrant::serve::PushFeaturizer;
use libfuzzer_sys::fuzz_target;

const PIPELINE: &str = r#"
name = "fuzz"
label = { column = "y" }
[[group]]
name = "dense"
kind = "dense"
columns = ["a", "b"]
steps = ["fill_null(0)", "log1p", "standardize", "clip(-3, 3)"]
[[group]]
name = "ids"
kind = "ids"
columns = ["c", "d"]
steps = ["vocab"]
[[group]]
name = "hashed"
kind = "ids"
columns = ["c"]
steps = ["hash_bucket(100)"]
"#;

fn setup() -> &'static (PipelineSpec, FittedState, SchemaRef) {
    static SETUP: OnceLock<(PipelineSpec, FittedState, SchemaRef)> = OnceLock::new();
    SETUP.get_or_init(|| {
        let spec = PipelineSpec::from_toml(PIPELINE, "fuzz.toml").unwrap();
        let mut params = std::collections::BTreeMap::new();
        for c in ["a", "b"] {
            let p = FittedParam::Standardize {
                mean: 1.0,
                std: 2.0,
            };
            params.insert(FittedState::key("dense", c, 2), p);
        }
        for c in ["c", "d"] {
            let values = ["x", "y", "zz"].into_iter().collect();
            params.insert(FittedState::key("ids", c, 0), FittedParam::Vocab { values });
        }
        let state = FittedState::new("fuzz", params);
        let output = spec.plan(&spec.nominal_schema()).unwrap().output_schema();
        (spec, state, output)
    })
}

/// Splits `data` into FlightData messages.
fn frames(mut data: &[u8]) -> Vec<FlightData> {
    let take = |data: &mut &[u8]| -> Option<bytes::Bytes> {
        let len = u32::from_le_bytes(data.get(..4)?.try_into().ok()?) as usize;
        let part = data.get(4..4 + len)?;
        let out = bytes::Bytes::copy_from_slice(part);
        *data = &data[4 + len..];
        Some(out)
    };
    let mut messages = Vec::new();
    while let (Some(header), Some(body)) = (take(&mut data), take(&mut data)) {
        messages.push(FlightData {
            data_header: header,
            data_body: body,
            ..Default::default()
        });
    }
    messages
}

fuzz_target!(|data: &[u8]| {
    let (spec, state, output) = setup();
    let messages = frames(data);
    if messages
        .iter()
        .any(|m| hydrant_flight::check_message(m).is_err())
    {
        return;
    }
    // As the service does: arrow's decoder runs guarded, and a panic in it refuses the
    // push (`decode_guarded`'s docs say which one arrow-ipc 60.1 still has).
    hydrant_flight::quiet_decoder_panics();
    let stream = futures::stream::iter(messages.into_iter().map(Ok));
    let Some(decoded) = hydrant_flight::decode_guarded(|| {
        futures::executor::block_on(
            FlightRecordBatchStream::new_from_flight_data(stream).collect::<Vec<_>>(),
        )
    }) else {
        return;
    };
    let mut featurizer = PushFeaturizer::new(spec.clone(), state.clone(), Arc::clone(output));
    let mut row = 0;
    for batch in decoded {
        let Ok(batch) = batch else { break };
        let rows = batch.num_rows();
        if let Ok(out) = featurizer.featurize(batch, row) {
            assert_eq!(out.num_rows(), rows);
            row += rows as u64;
        }
    }
});
