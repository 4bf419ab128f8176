//! The TLS certificates given to the builder (`tls_ca`,
//! `tls_client_cert`), as redis-rs takes them.

/// PEM certificates for TLS. Never printed.
#[derive(Clone, Default)]
pub(crate) struct TlsFiles {
    pub(crate) ca: Option<Vec<u8>>,
    pub(crate) client: Option<(Vec<u8>, Vec<u8>)>,
}

impl TlsFiles {
    pub(crate) fn is_set(&self) -> bool {
        self.ca.is_some() || self.client.is_some()
    }

    #[cfg(feature = "tls")]
    pub(crate) fn certificates(&self) -> redis::TlsCertificates {
        redis::TlsCertificates {
            client_tls: self
                .client
                .as_ref()
                .map(|(cert, key)| redis::ClientTlsConfig {
                    client_cert: cert.clone(),
                    client_key: key.clone(),
                }),
            root_cert: self.ca.clone(),
        }
    }
}
