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

/// A self-signed certificate for localhost valid from `start` to `end` (`YYYYMMDDHHMMSSZ`),
/// signed with `openssl ca`, which (unlike `req -x509` in OpenSSL 3.0) takes both dates:
/// (cert, key) files.
fn dated_certificate(dir: &Path, start: &str, end: &str) -> [String; 2] {
    let p = |name: &str| dir.join(name).to_str().unwrap().to_string();
    let [config, db, serial, csr, cert, key] = [
        "ca.cnf",
        "index.txt",
        "serial",
        "csr",
        "cert.pem",
        "key.pem",
    ]
    .map(p);
    std::fs::write(
        &config,
        format!(
            "[ca]\ndefault_ca = d\n[d]\ndatabase = {db}\nnew_certs_dir = {}\n\
             serial = {serial}\ndefault_md = sha256\npolicy = p\nx509_extensions = x\n\
             [p]\ncommonName = supplied\n\
             [x]\nsubjectAltName = IP:127.0.0.1\nbasicConstraints = CA:FALSE\n",
            dir.display()
        ),
    )
    .unwrap();
    std::fs::write(&db, "").unwrap();
    std::fs::write(&serial, "01\n").unwrap();
    openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=localhost",
        "-keyout",
        &key,
        "-out",
        &csr,
    ]);
    openssl(&[
        "ca",
        "-batch",
        "-config",
        &config,
        "-selfsign",
        "-keyfile",
        &key,
        "-in",
        &csr,
        "-out",
        &cert,
        "-startdate",
        start,
        "-enddate",
        end,
    ]);
    [cert, key]
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
                job: None,
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

/// An expired certificate used to be served without a word (every client then refused
/// it), and so would one not valid yet. Each is refused at start-up with its date.
#[test]
fn a_certificate_out_of_its_dates_is_refused_with_them() {
    let dir = tempfile::tempdir().unwrap();
    let input = gen_criteo(dir.path(), 100, 1);
    let toml = criteo_toml();
    for (start, end, needle) in [
        (
            "20200101000000Z",
            "20210101000000Z",
            "the certificate expired on 2021-01-01",
        ),
        (
            "20990101000000Z",
            "21000101000000Z",
            "is not valid until 2099-01-01",
        ),
    ] {
        let sub = tempfile::tempdir_in(dir.path()).unwrap();
        let [cert, key] = dated_certificate(sub.path(), start, end);
        let err = hydrant_err(&[
            "serve",
            "--pipeline",
            toml.to_str().unwrap(),
            "--input",
            input.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
        ]);
        assert!(err.contains(needle), "{start}..{end}: {err}");
    }
}

/// Found by a hostile run: a cluster whose processes were started one with TLS and one
/// without ran, and trainers' tokens would cross to the plaintext one in clear. Each
/// process now refuses, naming the other's location.
#[test]
fn a_cluster_half_over_tls_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (data, state) = folder_with_state(dir.path(), &[300], 5);
    let [_, cert, key] = certificates(dir.path(), "server");
    let children = spawn_cluster_with(dir.path(), 2, 1, |p| {
        let mut args: Vec<String> = [
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--pipeline",
            criteo_toml().to_str().unwrap(),
            "--input",
            data.to_str().unwrap(),
            "--state",
            state.to_str().unwrap(),
            "--ranks",
            "2",
        ]
        .map(String::from)
        .into();
        if p == 0 {
            args.extend(["--tls-cert", &cert, "--tls-key", &key].map(String::from));
        }
        args
    });
    for (p, child) in children.into_iter().enumerate() {
        let out = child.wait_with_output().unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "process {p}: {said}");
        let (other, scheme) = [(1, "grpc"), (0, "grpc+tls")][p];
        let needle = format!("process {other} of the cluster serves at {scheme}://");
        assert!(said.contains(&needle), "process {p}: {said}");
        assert!(said.contains("--tls-cert/--tls-key, or none"), "{said}");
    }
}
