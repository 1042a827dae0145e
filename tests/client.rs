//! The Rust client against a real `hydrant serve` over loopback, where the server does
//! what a trainer cannot control: it freezes (keep-alive cuts the stream), its tokens
//! expire, it restarts (the client logs in again).

use std::ffi::OsStr;
use std::time::{Duration, Instant};

use hydrant_flight::{Client, Connect, Ticket};

mod common;
use common::*;

/// Rank 0 of one, epoch 0, from step 0.
fn ticket() -> Ticket {
    Ticket {
        pipeline: "criteo".into(),
        epoch: 0,
        rank: 0,
        world_size: 1,
        start_step: 0,
        job: None,
    }
}

/// A server that stops answering (SIGSTOP: a frozen process, or a network that drops
/// everything) cuts the stream within twice the client's keep-alive; without pings the
/// trainer waited forever. 200,000 rows are more than the client's 16 MiB window, so the
/// stream cannot have ended before the server froze.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_server_cuts_the_stream_instead_of_hanging_it() {
    let dir = tempfile::tempdir().unwrap();
    let (data, state) = folder_with_state(dir.path(), &[200_000], 8);
    let (server, uri) = serve_criteo(&data, &state, &["--ranks", "1", "--batch-size", "100"]);
    let how = Connect {
        keepalive: Some(Duration::from_secs(1)),
        ..Default::default()
    };
    let mut client = Client::connect_with(&uri, &how).await.unwrap();
    let mut steps = client.steps(&ticket()).await.unwrap();
    steps.next_step().await.unwrap().unwrap();
    signal("-STOP", &[server.0.id()]);
    let began = Instant::now();
    let (mut read, limit) = (1, Duration::from_secs(30));
    let outcome = tokio::time::timeout(limit, async {
        loop {
            match steps.next_step().await {
                Some(Ok(_)) => read += 1,
                other => return other,
            }
        }
    })
    .await;
    signal("-CONT", &[server.0.id()]);
    let waited = began.elapsed();
    let outcome = outcome.expect("the stream still waits on a frozen server after 30 s");
    assert!(
        matches!(outcome, Some(Err(_))),
        "a frozen server's stream ended {outcome:?} after {read} of 2,000 steps"
    );
    assert!(
        read < 2_000 && waited < Duration::from_secs(15),
        "{read} steps, {waited:?}"
    );
}

/// A client that logged in is let in again by itself when its token is refused: after
/// `--token-ttl`, and by a restarted server, which knows no token it gave before (the
/// Python client had to be made anew, found by a hostile run; so did this one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_logs_in_again_when_its_token_expires_or_the_server_restarts() {
    const ROWS: u64 = 5_000;
    let dir = tempfile::tempdir().unwrap();
    let (data, state) = folder_with_state(dir.path(), &[ROWS], 13);
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, "alice:s3cret\n").unwrap();
    let toml = criteo_toml();
    let listen = format!("127.0.0.1:{}", free_port());
    let args: Vec<&OsStr> = [
        OsStr::new("--pipeline"),
        toml.as_os_str(),
        OsStr::new("--input"),
        data.as_os_str(),
        OsStr::new("--state"),
        state.as_os_str(),
        OsStr::new("--batch-size"),
        OsStr::new("1000"),
        OsStr::new("--token-file"),
        tokens.as_os_str(),
        OsStr::new("--token-ttl"),
        OsStr::new("1"),
    ]
    .to_vec();
    let every_row = async |client: &mut Client| {
        let t = client.tickets("criteo").await.unwrap().remove(0);
        let mut steps = client.steps(&t).await.unwrap();
        let mut rows = 0;
        while let Some(b) = steps.next_step().await {
            let b = b.unwrap();
            rows += b.meta.rows - b.meta.padded_rows;
        }
        assert_eq!(rows, ROWS);
    };
    let wait = || tokio::time::sleep(Duration::from_millis(1500));

    let (server, uri) = serve_on(&listen, &args);
    let mut client = Client::connect(&uri).await.unwrap();
    client.authenticate("alice", "s3cret").await.unwrap();
    let ticket = client.tickets("criteo").await.unwrap().remove(0);
    every_row(&mut client).await;
    // Each call below is the first after the token expired (or the server restarted).
    wait().await;
    assert!(client.steps(&ticket).await.is_ok());
    wait().await;
    every_row(&mut client).await;
    wait().await;
    assert!(client.status().await.unwrap()["pipelines"].is_array());
    wait().await;
    assert!(client.schema("criteo").await.is_ok());
    drop(server);

    let (server, _) = serve_on(&listen, &args);
    assert!(client.schema("criteo").await.is_ok());
    every_row(&mut client).await;
    drop(server);

    // A restarted server that no longer knows the user: its refusal, once.
    std::fs::write(&tokens, "bob:other\n").unwrap();
    let (_server, _) = serve_on(&listen, &args);
    let err = client.tickets("criteo").await.unwrap_err().to_string();
    assert!(err.contains("wrong user or password"), "{err}");
    // A client that never logged in has no login to repeat: the refusal as it is.
    let mut anonymous = Client::connect(&uri).await.unwrap();
    let err = anonymous.tickets("criteo").await.unwrap_err().to_string();
    assert!(err.contains("Unauthenticated"), "{err}");
}
