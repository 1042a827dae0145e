//! The Rust client over TLS against a real `hydrant serve --tls-cert/--tls-key` (a
//! self-signed certificate made with the openssl CLI): both ranks read whole, and a
//! client that does not speak TLS, or does not trust the certificate, is refused with a
//! clear error.

use std::path::Path;
use std::process::Command;

use hydrant_flight::{Client, Ticket};

mod common;
use common::*;

fn openssl(args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .output()
        .expect("the openssl CLI");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A certificate authority, and a certificate for 127.0.0.1 it signed: (ca, cert, key)
/// files. (rustls, unlike OpenSSL, refuses a self-signed CA certificate as the server's.)
fn certificates(dir: &Path, name: &str) -> [String; 3] {
    let p = |ext: &str| {
        dir.join(format!("{name}.{ext}"))
            .to_str()
            .unwrap()
            .to_string()
    };
    let [ca, ca_key, csr, cert, key, ext] = ["ca.pem", "ca.key", "csr", "pem", "key", "ext"].map(p);
    std::fs::write(
        &ext,
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n",
    )
    .unwrap();
    let new_key = ["-newkey", "rsa:2048", "-nodes"];
    openssl(
        &[
            &["req", "-x509", "-days", "2", "-subj", "/CN=test-ca"][..],
            &new_key,
            &["-keyout", &ca_key, "-out", &ca],
        ]
        .concat(),
    );
    openssl(
        &[
            &["req", "-subj", "/CN=localhost"][..],
            &new_key,
            &["-keyout", &key, "-out", &csr],
        ]
        .concat(),
    );
    openssl(&[
        "x509",
        "-req",
        "-days",
        "2",
        "-in",
        &csr,
        "-CA",
        &ca,
        "-CAkey",
        &ca_key,
        "-CAcreateserial",
        "-extfile",
        &ext,
        "-out",
        &cert,
    ]);
    [ca, cert, key]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_ranks_read_over_tls_and_plaintext_or_untrusted_clients_are_refused() {
    const ROWS: u64 = 20_000;
    let dir = tempfile::tempdir().unwrap();
    let (data, state) = folder_with_state(dir.path(), &[ROWS], 12);
    let [ca, cert, key] = certificates(dir.path(), "server");
    let (_server, uri) = serve_criteo(
        &data,
        &state,
        &[
            "--ranks",
            "2",
            "--batch-size",
            "1000",
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
        ],
    );
    let tls_uri = uri.replacen("http://", "grpc+tls://", 1);
    let ca = std::fs::read(&ca).unwrap();
    let reads = (0..2u32).map(|rank| {
        let (tls_uri, ca) = (tls_uri.clone(), ca.clone());
        tokio::spawn(async move {
            let mut client = Client::connect_tls(&tls_uri, &ca).await.unwrap();
            let t = Ticket {
                pipeline: "criteo".into(),
                epoch: 0,
                rank,
                world_size: 2,
                start_step: 0,
            };
            let mut steps = client.steps(&t).await.unwrap();
            let mut rows = 0;
            while let Some(b) = steps.next_step().await {
                let b = b.unwrap();
                rows += b.meta.rows - b.meta.padded_rows;
            }
            rows
        })
    });
    let mut rows = 0;
    for r in reads.collect::<Vec<_>>() {
        rows += r.await.unwrap();
    }
    assert_eq!(rows, ROWS);

    // Plaintext to a TLS port: the call fails, it does not hang or get data.
    let plain = async {
        let mut c = Client::connect(&uri).await?;
        c.tickets("criteo").await
    };
    let plain = tokio::time::timeout(std::time::Duration::from_secs(30), plain).await;
    assert!(matches!(plain, Ok(Err(_))), "{plain:?}");

    // A CA that did not sign the server's certificate: refused at connect.
    let [other, _, _] = certificates(dir.path(), "other");
    let other = std::fs::read(other).unwrap();
    let untrusted = async {
        let mut c = Client::connect_tls(&tls_uri, &other).await?;
        c.tickets("criteo").await
    };
    let err = untrusted.await.unwrap_err().to_string();
    assert!(
        err.contains("certificate") || err.contains("invalid peer"),
        "{err}"
    );
}

/// Found by a hostile run: a certificate file without a certificate said "peer sent no
/// certificates", and an encrypted or empty key "no RSA or PKCS8-encoded keys found"
/// (SEC1 keys are taken too). Each is now named for what it is, in one line.
#[test]
fn certificate_and_key_files_that_cannot_serve_say_why() {
    let dir = tempfile::tempdir().unwrap();
    let [_, cert, key] = certificates(dir.path(), "good");
    let encrypted = dir.path().join("enc.key").to_str().unwrap().to_string();
    let pass = ["-aes128", "-passout", "pass:pw"];
    openssl(&[&["pkey", "-in", &key, "-out", &encrypted][..], &pass].concat());
    let empty = dir.path().join("empty.pem");
    std::fs::write(&empty, "").unwrap();
    let empty = empty.to_str().unwrap();
    let input = gen_criteo(dir.path(), 100, 1);
    let toml = criteo_toml();
    let base = ["serve", "--pipeline", toml.to_str().unwrap()];
    let input = [
        "--input",
        input.to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
    ];
    for (cert, key, needle) in [
        (empty, &key[..], "holds no PEM certificate"),
        (&key[..], &key[..], "holds no PEM certificate"),
        (&cert[..], &encrypted[..], "encrypted with a passphrase"),
        (&cert[..], empty, "holds no PEM private key"),
    ] {
        let tls = ["--tls-cert", cert, "--tls-key", key];
        let err = hydrant_err(&[&base[..], &input, &tls].concat());
        assert!(err.contains(needle), "{cert} {key}: {err}");
        assert!(!err.contains("peer"), "{err}");
    }
}
