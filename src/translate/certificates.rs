//! What Secrets and ConfigMaps hold for TLS: the certificate and key of a
//! `kubernetes.io/tls` Secret (listener certificates, the Gateway's backend
//! client certificate) and the CA bundle under a ConfigMap's `ca.crt`
//! (frontend client validation, BackendTLSPolicy).
//!
//! The functions say what is wrong in a message; finding the object and
//! naming it is [`super::references`]'s.

use std::sync::Arc;

use k8s_openapi::ByteString;
use rustls::RootCertStore;
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::resources::{ConfigMap, Secret};

/// The certificate chain and private key of a `kubernetes.io/tls` Secret.
#[derive(Debug)]
pub(crate) struct KeyPair {
    pub chain: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
}

/// One key of a Secret: `stringData` wins over `data`, as the API server
/// merges them.
fn secret_value<'a>(secret: &'a Secret, key: &str) -> Option<&'a [u8]> {
    if let Some(v) = secret.string_data.as_ref().and_then(|d| d.get(key)) {
        return Some(v.as_bytes());
    }
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|ByteString(b)| b.as_slice())
}

/// `tls.crt` and `tls.key` of a `kubernetes.io/tls` Secret (a Secret
/// without a type is taken as one), parsed but not yet checked to belong
/// together.
fn parse_key_pair(secret: &Secret) -> Result<KeyPair, String> {
    if let Some(t) = secret.type_.as_deref()
        && t != "kubernetes.io/tls"
    {
        return Err(format!("type is {t}, expected kubernetes.io/tls"));
    }
    let crt = secret_value(secret, "tls.crt").ok_or("tls.crt is missing")?;
    let key = secret_value(secret, "tls.key").ok_or("tls.key is missing")?;
    let chain = CertificateDer::pem_slice_iter(crt)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("tls.crt is not valid PEM: {e}"))?;
    if chain.is_empty() {
        return Err("tls.crt holds no PEM certificate".into());
    }
    let key = PrivateKeyDer::from_pem_slice(key)
        .map_err(|e| format!("tls.key holds no usable PEM private key: {e}"))?;
    Ok(KeyPair { chain, key })
}

fn certified(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<CertifiedKey, String> {
    let provider = rustls::crypto::ring::default_provider();
    CertifiedKey::from_der(chain, key, &provider)
        .map_err(|e| format!("certificate and key cannot be used: {e}"))
}

/// The certificate a TLS server presents, from a `kubernetes.io/tls`
/// Secret: its chain and key, checked to belong together.
pub(crate) fn certified_key(secret: &Secret) -> Result<Arc<CertifiedKey>, String> {
    let KeyPair { chain, key } = parse_key_pair(secret)?;
    certified(chain, key).map(Arc::new)
}

/// The chain and key of a `kubernetes.io/tls` Secret, checked to belong
/// together (what a TLS client presents).
pub(crate) fn key_pair(secret: &Secret) -> Result<KeyPair, String> {
    let pair = parse_key_pair(secret)?;
    certified(pair.chain.clone(), pair.key.clone_key())?;
    Ok(pair)
}

/// The CA certificates of a ConfigMap's `ca.crt` (PEM, one or more, in
/// `data` or `binaryData`), each checked to be usable as a trust anchor.
pub(crate) fn ca_bundle(cm: &ConfigMap) -> Result<Vec<CertificateDer<'static>>, String> {
    let pem: &[u8] = if let Some(v) = cm.data.as_ref().and_then(|d| d.get("ca.crt")) {
        v.as_bytes()
    } else if let Some(ByteString(b)) = cm.binary_data.as_ref().and_then(|d| d.get("ca.crt")) {
        b
    } else {
        return Err("ca.crt is missing".into());
    };
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("ca.crt is not valid PEM: {e}"))?;
    if certs.is_empty() {
        return Err("ca.crt holds no PEM certificate".into());
    }
    let mut store = RootCertStore::empty();
    for (n, c) in certs.iter().enumerate() {
        store
            .add(c.clone())
            .map_err(|e| format!("certificate {n} of ca.crt is not a usable trust anchor: {e}"))?;
    }
    Ok(certs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn secret(crt: &str, key: &str, ty: Option<&str>) -> Secret {
        Secret {
            type_: ty.map(str::to_string),
            string_data: Some(BTreeMap::from([
                ("tls.crt".to_string(), crt.to_string()),
                ("tls.key".to_string(), key.to_string()),
            ])),
            ..Secret::default()
        }
    }

    fn generated(name: &str) -> (String, String) {
        let c = rcgen::generate_simple_self_signed(vec![name.to_string()]).unwrap();
        (c.cert.pem(), c.signing_key.serialize_pem())
    }

    #[test]
    fn a_generated_certificate_and_key_load() {
        let (crt, key) = generated("a.example");
        assert!(certified_key(&secret(&crt, &key, Some("kubernetes.io/tls"))).is_ok());
        // `data` (base64 in the manifest) works the same.
        let s = Secret {
            data: Some(BTreeMap::from([
                ("tls.crt".to_string(), ByteString(crt.into_bytes())),
                ("tls.key".to_string(), ByteString(key.into_bytes())),
            ])),
            ..Secret::default()
        };
        assert!(certified_key(&s).is_ok());
        let pair = key_pair(&s).expect("a client certificate");
        assert_eq!(pair.chain.len(), 1);
    }

    #[test]
    fn malformed_or_mismatched_secrets_are_refused_with_a_reason() {
        let (crt, key) = generated("a.example");
        let (_, other_key) = generated("b.example");
        let hello = "Hello world\n";
        for (s, needle) in [
            (secret(hello, hello, None), "no PEM certificate"),
            (secret(&crt, hello, None), "private key"),
            (secret(&crt, &other_key, None), "cannot be used"),
            (
                secret(&crt, &key, Some("Opaque")),
                "expected kubernetes.io/tls",
            ),
            (Secret::default(), "tls.crt is missing"),
        ] {
            let err = certified_key(&s).unwrap_err();
            assert!(err.contains(needle), "{err:?} should mention {needle:?}");
            let err = key_pair(&s).unwrap_err();
            assert!(err.contains(needle), "{err:?} should mention {needle:?}");
        }
    }

    fn ca_pem() -> String {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().pem()
    }

    #[test]
    fn ca_bundles_are_read_from_data_or_binary_data() {
        let ca = ca_pem();
        let two = format!("{ca}{}", ca_pem());
        let from_data = ConfigMap {
            data: Some(BTreeMap::from([("ca.crt".to_string(), two)])),
            ..ConfigMap::default()
        };
        assert_eq!(ca_bundle(&from_data).map(|c| c.len()), Ok(2));
        let from_binary = ConfigMap {
            binary_data: Some(BTreeMap::from([(
                "ca.crt".to_string(),
                ByteString(ca.into_bytes()),
            )])),
            ..ConfigMap::default()
        };
        assert_eq!(ca_bundle(&from_binary).map(|c| c.len()), Ok(1));
    }

    #[test]
    fn unusable_ca_bundles_are_refused_with_a_reason() {
        let with = |pem: &str| ConfigMap {
            data: Some(BTreeMap::from([("ca.crt".to_string(), pem.to_string())])),
            ..ConfigMap::default()
        };
        let not_a_certificate = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        for (cm, needle) in [
            (ConfigMap::default(), "ca.crt is missing"),
            (with("Hello world\n"), "no PEM certificate"),
            (with(not_a_certificate), "not a usable trust anchor"),
        ] {
            let err = ca_bundle(&cm).unwrap_err();
            assert!(err.contains(needle), "{err:?} should mention {needle:?}");
        }
    }
}
