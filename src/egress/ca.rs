//! The kernelbox egress CA (`docs/reliability.md`, "Credentials at the boundary"): generated
//! once per server into its CA directory (key `0600`, readable by kernelbox only) or put there
//! by the operator, rotated on request; it signs the leaf certificate the proxy shows a kernel
//! for a host whose connections it intercepts (cached, at most [`MAX_LEAVES`]). Kernels trust
//! it through a bundle (the operator's CA bundle and this CA's certificate, never its key).

use std::collections::{HashMap, VecDeque};
use std::io::Write as _;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// The CA's certificate in its directory.
pub const CA_CERT_FILE: &str = "egress-ca.crt";
/// The CA's key in its directory (`0600`).
pub const CA_KEY_FILE: &str = "egress-ca.key";
/// The bundle kernels trust: the operator's CA bundle and the CA's certificate.
pub const BUNDLE_FILE: &str = "egress-ca-bundle.crt";
/// Leaf certificates kept (one per intercepted host); past it the oldest is dropped.
pub const MAX_LEAVES: usize = 1024;

/// The CA cannot be made, read or used. Never carries key material.
#[derive(Debug, thiserror::Error)]
pub enum CaError {
    /// A file of the CA directory.
    #[error("the egress CA: {op} {path}: {message}")]
    File {
        /// What was done.
        op: &'static str,
        /// The file of the CA directory concerned.
        path: PathBuf,
        /// What the system said.
        message: String,
    },
    /// The key file is readable by others than kernelbox.
    #[error("the egress CA key {0} is readable by others: chmod 600 it")]
    KeyMode(PathBuf),
    /// Generating or signing a certificate, or building a TLS configuration.
    #[error("the egress CA: {op}: {message}")]
    Tls {
        /// What was done.
        op: &'static str,
        /// What failed.
        message: String,
    },
}

fn tls(op: &'static str) -> impl Fn(String) -> CaError {
    move |message| CaError::Tls { op, message }
}

/// Leaf configurations by host, and the hosts oldest first.
type Leaves = (HashMap<String, Arc<rustls::ServerConfig>>, VecDeque<String>);

/// The CA and its cache of leaf configurations.
pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    cert_pem: String,
    leaves: Mutex<Leaves>,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca").finish_non_exhaustive()
    }
}

/// The TLS provider every configuration here is built with.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read(path: &Path) -> Result<String, CaError> {
    std::fs::read_to_string(path).map_err(|e| CaError::File {
        op: "reading",
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

fn write(path: &Path, text: &str, mode: u32) -> Result<(), CaError> {
    let fail = |e: std::io::Error| CaError::File {
        op: "writing",
        path: path.to_path_buf(),
        message: e.to_string(),
    };
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)
        .map_err(fail)?;
    file.write_all(text.as_bytes()).map_err(fail)?;
    file.sync_all().map_err(fail)?;
    std::fs::rename(&tmp, path).map_err(fail)
}

impl Ca {
    /// The CA in `dir`: read when its two files are there (`rotate`: replaced by a new one),
    /// else generated and written. Writes the kernels' bundle (`ca_bundle` and the CA's
    /// certificate) next to them; returns the CA and the bundle's path.
    pub fn open(dir: &Path, ca_bundle: &Path, rotate: bool) -> Result<(Ca, PathBuf), CaError> {
        std::fs::create_dir_all(dir).map_err(|e| CaError::File {
            op: "creating",
            path: dir.to_path_buf(),
            message: e.to_string(),
        })?;
        let (cert_path, key_path) = (dir.join(CA_CERT_FILE), dir.join(CA_KEY_FILE));
        let ca = if !rotate && cert_path.is_file() && key_path.is_file() {
            let mode = std::fs::metadata(&key_path)
                .map_err(|e| CaError::File {
                    op: "reading",
                    path: key_path.clone(),
                    message: e.to_string(),
                })?
                .permissions()
                .mode();
            if mode & 0o077 != 0 {
                return Err(CaError::KeyMode(key_path));
            }
            let cert_pem = read(&cert_path)?;
            let key = KeyPair::from_pem(&read(&key_path)?)
                .map_err(|e| tls("reading the key")(e.to_string()))?;
            let issuer = Issuer::from_ca_cert_pem(&cert_pem, key)
                .map_err(|e| tls("reading the certificate")(e.to_string()))?;
            Ca::new(issuer, cert_pem)
        } else {
            let key = KeyPair::generate().map_err(|e| tls("generating a key")(e.to_string()))?;
            let mut params = CertificateParams::default();
            params
                .distinguished_name
                .push(DnType::CommonName, "kernelbox egress CA");
            params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
            params.key_usages = vec![
                KeyUsagePurpose::KeyCertSign,
                KeyUsagePurpose::CrlSign,
                KeyUsagePurpose::DigitalSignature,
            ];
            let cert = params
                .self_signed(&key)
                .map_err(|e| tls("signing the CA")(e.to_string()))?;
            write(&key_path, &key.serialize_pem(), 0o600)?;
            write(&cert_path, &cert.pem(), 0o644)?;
            Ca::new(Issuer::new(params, key), cert.pem())
        };
        let mut bundle = read(ca_bundle)?;
        if !bundle.ends_with('\n') {
            bundle.push('\n');
        }
        bundle.push_str(&ca.cert_pem);
        let bundle_path = dir.join(BUNDLE_FILE);
        write(&bundle_path, &bundle, 0o644)?;
        Ok((ca, bundle_path))
    }

    fn new(issuer: Issuer<'static, KeyPair>, cert_pem: String) -> Ca {
        Ca {
            issuer,
            cert_pem,
            leaves: Mutex::new((HashMap::new(), VecDeque::new())),
        }
    }

    /// The CA's certificate (PEM).
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The TLS configuration a kernel is shown for `host`: a leaf for it signed by the CA.
    pub fn leaf(&self, host: &str) -> Result<Arc<rustls::ServerConfig>, CaError> {
        if let Some(c) = self
            .leaves
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .0
            .get(host)
        {
            return Ok(c.clone());
        }
        let key = KeyPair::generate().map_err(|e| tls("generating a key")(e.to_string()))?;
        let mut params = CertificateParams::new(vec![host.to_string()])
            .map_err(|e| tls("a leaf's name")(e.to_string()))?;
        params.distinguished_name.push(DnType::CommonName, host);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(|e| tls("signing a leaf")(e.to_string()))?;
        let key_der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| tls("a leaf's configuration")(e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(vec![cert.der().clone()], key_der)
            .map_err(|e| tls("a leaf's configuration")(e.to_string()))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let config = Arc::new(config);
        let mut leaves = self.leaves.lock().unwrap_or_else(|p| p.into_inner());
        if leaves.0.insert(host.to_string(), config.clone()).is_none() {
            leaves.1.push_back(host.to_string());
        }
        while leaves.1.len() > MAX_LEAVES {
            if let Some(old) = leaves.1.pop_front() {
                leaves.0.remove(&old);
            }
        }
        Ok(config)
    }

    /// Leaf configurations cached.
    pub fn cached(&self) -> usize {
        self.leaves
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .0
            .len()
    }
}

/// The TLS configuration of upstream connections: servers verified against `ca_bundle` only
/// (the host's real trust store, `--ca-bundle`).
pub fn upstream(ca_bundle: &Path) -> Result<Arc<rustls::ClientConfig>, CaError> {
    let mut roots = rustls::RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(ca_bundle)
        .map_err(|e| CaError::File {
            op: "reading",
            path: ca_bundle.to_path_buf(),
            message: e.to_string(),
        })?
        .filter_map(Result::ok);
    let (added, _) = roots.add_parsable_certificates(certs);
    if added == 0 {
        return Err(CaError::File {
            op: "reading",
            path: ca_bundle.to_path_buf(),
            message: "no certificate in it".into(),
        });
    }
    let mut config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| tls("the upstream configuration")(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ca_is_kept_with_a_private_key_and_rotated_on_request() {
        let dir = tempfile::tempdir().expect("dir");
        let bundle = dir.path().join("roots.crt");
        std::fs::write(&bundle, "").expect("bundle");
        let (first, path) = Ca::open(dir.path(), &bundle, false).expect("generated");
        let mode = std::fs::metadata(dir.path().join(CA_KEY_FILE))
            .expect("key")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let kernels = std::fs::read_to_string(&path).expect("bundle");
        assert!(kernels.contains(first.cert_pem()) && !kernels.contains("PRIVATE KEY"));
        let (again, _) = Ca::open(dir.path(), &bundle, false).expect("read");
        assert_eq!(first.cert_pem(), again.cert_pem());
        again.leaf("api.example.com").expect("leaf");
        assert_eq!(again.cached(), 1);
        let (rotated, _) = Ca::open(dir.path(), &bundle, true).expect("rotated");
        assert_ne!(first.cert_pem(), rotated.cert_pem());
    }
}
