//! DoPut against the real server with mutated IPC messages: each push ends with an error
//! status or with an acknowledgement for its batch — never OK without one, never a panic —
//! and the server keeps taking good batches.

use arrow::array::RecordBatch;
use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::{FlightData, FlightDescriptor, Ticket};
use futures::{StreamExt, TryStreamExt};

mod common;
use common::Server;
use common::pushed::{batch, produced, start_with};

fn start(dir: &std::path::Path) -> (Server, String) {
    start_with(dir, &[])
}

/// The FlightData of a push of `batch`: descriptor and schema, then the batch.
async fn messages(batch: RecordBatch) -> Vec<FlightData> {
    produced(batch, None).await
}

/// What a push got back: its acknowledgements, or the status it ended with.
async fn push(
    client: &mut FlightServiceClient<tonic::transport::Channel>,
    messages: Vec<FlightData>,
) -> Result<usize, tonic::Status> {
    let response = client.do_put(futures::stream::iter(messages)).await?;
    let acks: Vec<_> = response.into_inner().try_collect().await?;
    Ok(acks.len())
}

/// xorshift64*: a fixed sequence of mutations without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn mutate(rng: &mut Rng, good: &[FlightData]) -> Vec<FlightData> {
    let mut out = good.to_vec();
    let m = out.last_mut().unwrap();
    let target = if rng.below(2) == 0 {
        &mut m.data_header
    } else {
        &mut m.data_body
    };
    let mut bytes = target.to_vec();
    match rng.below(4) {
        0 if !bytes.is_empty() => bytes.truncate(rng.below(bytes.len())),
        // A plausible number where the header keeps its numbers (buffer offsets and
        // lengths, row and null counts): the flatbuffer stays valid, its values do not.
        1 if bytes.len() >= 8 => {
            let at = rng.below(bytes.len() / 8) * 8;
            let value = (rng.next() % (1 << 20)) as i64;
            bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
        }
        _ => {
            for _ in 0..1 + rng.below(4) {
                if bytes.is_empty() {
                    break;
                }
                let at = rng.below(bytes.len());
                bytes[at] = rng.next() as u8;
            }
        }
    }
    *target = bytes.into();
    out
}

/// FlightData framed as the `doput` fuzz target reads them (`u32 LE length, header,
/// u32 LE length, body`), the first given the ingest descriptor.
fn unframe(mut data: &[u8]) -> Vec<FlightData> {
    let mut parts = Vec::new();
    while data.len() >= 4 {
        let len = u32::from_le_bytes(data[..4].try_into().unwrap()) as usize;
        parts.push(bytes::Bytes::copy_from_slice(&data[4..4 + len]));
        data = &data[4 + len..];
    }
    let mut messages: Vec<FlightData> = parts
        .chunks(2)
        .map(|p| FlightData {
            data_header: p[0].clone(),
            data_body: p[1].clone(),
            ..Default::default()
        })
        .collect();
    messages[0].flight_descriptor = Some(FlightDescriptor::new_path(vec![
        "ingest".into(),
        "pushed".into(),
    ]));
    messages
}

#[test]
fn mutated_pushes_end_with_an_error_or_an_acknowledgement() {
    let dir = tempfile::tempdir().unwrap();
    let (mut server, uri) = start(dir.path());
    let rt = common::pushed::runtime();
    rt.block_on(async {
        let connect = |uri: String| async move {
            let channel = tonic::transport::Channel::from_shared(uri)
                .unwrap()
                .connect()
                .await
                .unwrap();
            FlightServiceClient::new(channel)
        };
        let mut client = connect(uri.clone()).await;
        // A reader, so that accepted rows never back-pressure the pushes.
        let mut reader = connect(uri).await;
        let ticket = r#"{"pipeline":"pushed","rank":0,"world_size":1}"#;
        let drain = tokio::spawn(async move {
            let mut s = reader
                .do_get(Ticket::new(ticket))
                .await
                .unwrap()
                .into_inner();
            while let Some(Ok(_)) = s.next().await {}
        });
        let good = messages(batch(50)).await;
        assert_eq!(push(&mut client, good.clone()).await.unwrap(), 1);
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let (mut refused, mut taken) = (0, 0);
        for i in 0..400 {
            let mutated = mutate(&mut rng, &good);
            let last = mutated.last().unwrap();
            let still_a_batch = arrow::ipc::root_as_message(&last.data_header)
                .is_ok_and(|m| m.header_type() == arrow::ipc::MessageHeader::RecordBatch);
            match push(&mut client, mutated).await {
                Err(status) => {
                    assert!(
                        matches!(
                            status.code(),
                            tonic::Code::InvalidArgument | tonic::Code::ResourceExhausted
                        ),
                        "try {i}: {status:?}"
                    );
                    refused += 1;
                }
                Ok(acks) => {
                    assert!(
                        acks == 1 || !still_a_batch,
                        "try {i}: a batch ended OK with {acks} acknowledgements"
                    );
                    taken += 1;
                }
            }
        }
        assert!(
            refused > 100 && taken > 10,
            "{refused} refused, {taken} taken"
        );
        // Found by fuzzing: passes the message checks, then fails an assertion inside
        // arrow-ipc 60.1's decoder (an offsets buffer whose length is not a multiple of 4).
        let found = include_bytes!("data/doput_offsets_not_a_multiple.bin");
        let status = push(&mut client, unframe(found)).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        // Still serving.
        assert_eq!(push(&mut client, good).await.unwrap(), 1);
        drain.abort();
    });
    assert!(server.0.try_wait().unwrap().is_none(), "the server died");
    let _ = server.0.kill();
    let mut stderr = String::new();
    std::io::Read::read_to_string(server.0.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert!(!stderr.contains("panicked"), "{stderr}");
}
