//! The uplink to Apache Pulsar: a producer per source that speaks the binary protocol itself
//! (the `pulsar` crate supplies only the protocol types), with native chunking for large frames
//! and sequence ids that make broker-side deduplication exact across restarts; the rig's
//! producers share one connection per broker (`pool`).

mod batch;
pub mod budget;
mod codec;
mod connect;
pub mod control;
mod error;
pub mod estimate;
pub mod identity;
pub mod links;
pub mod plan;
pub mod pool;
mod probe;
mod producer;
pub mod route;
mod serve;
mod session;
mod token;
mod topic;
pub mod window;

pub use batch::BatchPolicy;
pub use budget::Budget;
pub use pool::Pool;
pub use producer::{crash_between_chunks, Producer, ProducerConfig, ProducerStats, SHUTDOWN_GRACE};
pub use token::Token;
pub use topic::TopicProducer;
pub use window::{Ack, Outcome};

/// Client TLS settings: the CA certificates of `ca_file` (PEM), or the Mozilla roots when absent;
/// with `client` (certificate chain and key, PEM), the rig's identity for mutual TLS.
pub fn tls_config(
    ca_file: Option<&std::path::Path>,
    client: Option<(&std::path::Path, &std::path::Path)>,
) -> Result<std::sync::Arc<rustls::ClientConfig>, String> {
    use rustls_pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    match ca_file {
        Some(path) => {
            let certs = rustls_pki_types::CertificateDer::pem_file_iter(path)
                .map_err(|e| format!("{}: {e}", path.display()))?;
            for cert in certs {
                let cert = cert.map_err(|e| format!("{}: {e}", path.display()))?;
                roots
                    .add(cert)
                    .map_err(|e| format!("{}: {e}", path.display()))?;
            }
            if roots.is_empty() {
                return Err(format!("{}: no certificates found", path.display()));
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots);
    let config = match client {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let chain = rustls_pki_types::CertificateDer::pem_file_iter(cert)
                .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
                .map_err(|e| format!("{}: {e}", cert.display()))?;
            if chain.is_empty() {
                return Err(format!("{}: no certificates found", cert.display()));
            }
            let key_der = rustls_pki_types::PrivateKeyDer::from_pem_file(key)
                .map_err(|e| format!("{}: {e}", key.display()))?;
            builder
                .with_client_auth_cert(chain, key_der)
                .map_err(|e| format!("{} / {}: {e}", cert.display(), key.display()))?
        }
    };
    Ok(std::sync::Arc::new(config))
}
