//! The server's TLS identity: its PEM certificate chain and key checked before serving,
//! with errors that say what is wrong where tonic's and rustls's mislead, and the chain's
//! validity dates, which rustls does not look at for a server's own certificate.

use tonic::transport::{Identity, ServerTlsConfig};

/// Checks that `cert_pem` and `key_pem` make a TLS identity to serve with, as
/// [`FlightServer::with_tls`](crate::FlightServer::with_tls) would take them: for a program that must refuse them before
/// it does anything else (a cluster's process, before it joins its peers).
pub fn check_tls(cert_pem: &[u8], key_pem: &[u8]) -> Result<(), String> {
    check_pem(cert_pem, key_pem)?;
    identity(cert_pem, key_pem).map(drop).map_err(|e| {
        // rustls speaks of its peer's certificate; here it is the server's own.
        e.replace(
            "invalid peer certificate",
            "the certificate cannot be served",
        )
    })
}

/// The server's TLS configuration of a PEM certificate chain and key that rustls takes
/// and whose certificates are valid now.
pub(crate) fn identity(cert_pem: &[u8], key_pem: &[u8]) -> Result<ServerTlsConfig, String> {
    let config = tls_config(cert_pem, key_pem)?;
    check_dates(cert_pem, unix_now())?;
    Ok(config)
}

/// The time since the Unix epoch (zero for a clock set before it).
fn unix_now() -> std::time::Duration {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
}

/// Whether every certificate of the chain is valid at `now` (since the Unix epoch): rustls
/// serves an expired certificate without a word, and every client then refuses it.
fn check_dates(cert_pem: &[u8], now: std::time::Duration) -> Result<(), String> {
    use rustls_pki_types::{CertificateDer, pem::PemObject};
    use x509_cert::der::Decode;
    let chain = CertificateDer::pem_slice_iter(cert_pem).filter_map(Result::ok);
    for (i, der) in chain.enumerate() {
        // What does not parse here was refused by rustls already.
        let Ok(cert) = x509_cert::Certificate::from_der(&der) else {
            continue;
        };
        let tbs = cert.tbs_certificate();
        let which = match i {
            0 => "the certificate".to_string(),
            _ => format!("certificate {} of the chain ({})", i + 1, tbs.subject()),
        };
        let validity = tbs.validity();
        if validity.not_after.to_unix_duration() < now {
            return Err(format!(
                "{which} expired on {}: renew it",
                validity.not_after
            ));
        }
        if validity.not_before.to_unix_duration() > now {
            return Err(format!(
                "{which} is not valid until {} (is this machine's clock right?)",
                validity.not_before
            ));
        }
    }
    Ok(())
}

/// What the PEM files hold, said plainly where tonic's words mislead ("peer sent no
/// certificates" for a certificate file without one; "no RSA or PKCS8-encoded keys" for
/// an encrypted key, though SEC1 keys are taken too).
fn check_pem(cert_pem: &[u8], key_pem: &[u8]) -> Result<(), String> {
    let (cert, key) = (
        String::from_utf8_lossy(cert_pem),
        String::from_utf8_lossy(key_pem),
    );
    if !cert.contains("-----BEGIN CERTIFICATE-----") {
        return Err("the certificate file holds no PEM certificate \
                    (`-----BEGIN CERTIFICATE-----`)"
            .into());
    }
    if key.contains("-----BEGIN ENCRYPTED PRIVATE KEY-----")
        || key.contains("Proc-Type: 4,ENCRYPTED")
    {
        return Err(
            "the key is encrypted with a passphrase, which is not supported: \
                    decrypt it first (`openssl pkey -in KEY -out PLAIN`)"
                .into(),
        );
    }
    let labels = ["PRIVATE KEY", "RSA PRIVATE KEY", "EC PRIVATE KEY"];
    if !labels
        .iter()
        .any(|l| key.contains(&format!("-----BEGIN {l}-----")))
    {
        return Err(
            "the key file holds no PEM private key (PKCS#8 `PRIVATE KEY`, PKCS#1 \
                    `RSA PRIVATE KEY` or SEC1 `EC PRIVATE KEY`)"
                .into(),
        );
    }
    Ok(())
}

/// The server's TLS configuration of a PEM certificate (chain) and key, built once here so
/// that a bad certificate or key is refused before serving.
fn tls_config(cert_pem: &[u8], key_pem: &[u8]) -> Result<ServerTlsConfig, String> {
    let config = ServerTlsConfig::new().identity(Identity::from_pem(cert_pem, key_pem));
    tonic::transport::Server::builder()
        .tls_config(config.clone())
        .map_err(|e| crate::client::chain(&e))?;
    Ok(config)
}
