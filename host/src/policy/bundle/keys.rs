//! Ed25519 keys for signing bundles, as PEM files that interoperate with OpenSSL: a PKCS#8
//! private key (`openssl genpkey -algorithm ed25519 -out k.pem`) and an SPKI public key
//! (`openssl pkey -in k.pem -pubout -out k.pub.pem`).

use super::error::Fault;
use super::format::SignatureFile;
use base64::Engine as _;
use ed25519_dalek::pkcs8::spki::der::pem::LineEnding;
use ed25519_dalek::pkcs8::{DecodePrivateKey, DecodePublicKey, EncodePrivateKey, EncodePublicKey};
use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use std::path::{Path, PathBuf};

pub const ALGORITHM: &str = "ed25519";

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not an ed25519 {what} key in PEM ({expected}): {message}")]
    Parse {
        path: PathBuf,
        what: &'static str,
        expected: &'static str,
        message: String,
    },
    #[error("cannot write {path}: {message}")]
    Write { path: PathBuf, message: String },
    #[error("no randomness for a new key: {0}")]
    Random(String),
}

/// The key id a `.signature` names: the first 16 hex characters of the sha256 of the public
/// key's raw 32 bytes.
pub fn key_id(key: &VerifyingKey) -> String {
    crate::decision::event::sha256_hex(key.as_bytes())[..16].to_string()
}

pub fn read_private_key(path: &Path) -> Result<SigningKey, KeyError> {
    let text = read(path)?;
    SigningKey::from_pkcs8_pem(&text).map_err(|e| KeyError::Parse {
        path: path.to_path_buf(),
        what: "private",
        expected: "-----BEGIN PRIVATE KEY-----, PKCS#8",
        message: e.to_string(),
    })
}

pub fn read_public_key(path: &Path) -> Result<VerifyingKey, KeyError> {
    let text = read(path)?;
    VerifyingKey::from_public_key_pem(&text).map_err(|e| KeyError::Parse {
        path: path.to_path_buf(),
        what: "public",
        expected: "-----BEGIN PUBLIC KEY-----, SPKI",
        message: e.to_string(),
    })
}

fn read(path: &Path) -> Result<String, KeyError> {
    std::fs::read_to_string(path).map_err(|source| KeyError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// A new key pair from the operating system's randomness.
pub fn generate() -> Result<SigningKey, KeyError> {
    let mut seed = [0u8; 32];
    getrandom::fill(&mut seed).map_err(|e| KeyError::Random(e.to_string()))?;
    Ok(SigningKey::from_bytes(&seed))
}

/// `KEY.pub.pem` beside `KEY.pem` (`KEY` + `.pub.pem` when the name does not end in `.pem`).
pub fn public_path_of(private: &Path) -> PathBuf {
    let name = private
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let stem = name.strip_suffix(".pem").unwrap_or(&name);
    private.with_file_name(format!("{stem}.pub.pem"))
}

/// Writes the private key (mode 0600, created new: an existing key is never overwritten) and
/// its public key beside it; returns the public key's path.
pub fn write_pair(key: &SigningKey, private: &Path) -> Result<PathBuf, KeyError> {
    let write_err = |path: &Path, e: &dyn std::fmt::Display| KeyError::Write {
        path: path.to_path_buf(),
        message: e.to_string(),
    };
    // PKCS#8 v1 (the seed alone), as OpenSSL writes it: OpenSSL 3 does not read the v2 form
    // that also carries the public key.
    let seed = ed25519_dalek::pkcs8::KeypairBytes {
        secret_key: key.to_bytes(),
        public_key: None,
    };
    let pem = seed
        .to_pkcs8_pem(LineEnding::LF)
        .map_err(|e| write_err(private, &e))?;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options.open(private).map_err(|e| write_err(private, &e))?;
    std::io::Write::write_all(&mut file, pem.as_bytes()).map_err(|e| write_err(private, &e))?;
    let public = public_path_of(private);
    let public_pem = key
        .verifying_key()
        .to_public_key_pem(LineEnding::LF)
        .map_err(|e| write_err(&public, &e))?;
    std::fs::write(&public, public_pem).map_err(|e| write_err(&public, &e))?;
    Ok(public)
}

/// The `.signature` of a manifest.
pub fn sign(key: &SigningKey, manifest_bytes: &[u8]) -> SignatureFile {
    let signature = key.sign(manifest_bytes);
    SignatureFile {
        algorithm: ALGORITHM.into(),
        key_id: key_id(&key.verifying_key()),
        signature: base64::engine::general_purpose::STANDARD.encode(signature.to_bytes()),
    }
}

/// Checks a `.signature` against the manifest's bytes and the trusted key.
pub fn check(
    signature_bytes: &[u8],
    manifest_bytes: &[u8],
    trusted: &VerifyingKey,
) -> Result<(), Fault> {
    let file: SignatureFile = serde_json::from_slice(signature_bytes)
        .map_err(|e| Fault::Signature(format!("not the expected JSON: {e}")))?;
    if file.algorithm != ALGORITHM {
        return Err(Fault::Signature(format!(
            "algorithm {:?}, only {ALGORITHM:?} is accepted",
            file.algorithm
        )));
    }
    let expected = key_id(trusted);
    if file.key_id != expected {
        return Err(Fault::WrongKey {
            found: file.key_id,
            expected,
        });
    }
    let raw = base64::engine::general_purpose::STANDARD
        .decode(file.signature.trim())
        .map_err(|e| Fault::Signature(format!("not base64: {e}")))?;
    let signature = Signature::from_slice(&raw)
        .map_err(|e| Fault::Signature(format!("not an ed25519 signature: {e}")))?;
    trusted
        .verify_strict(manifest_bytes, &signature)
        .map_err(|_| Fault::Signature("does not match the manifest".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_verifies_only_with_its_key_and_its_manifest() {
        let key = generate().unwrap();
        let other = generate().unwrap();
        let sig = serde_json::to_vec(&sign(&key, b"manifest")).unwrap();
        check(&sig, b"manifest", &key.verifying_key()).unwrap();
        assert!(matches!(
            check(&sig, b"manifesT", &key.verifying_key()),
            Err(Fault::Signature(_))
        ));
        assert!(matches!(
            check(&sig, b"manifest", &other.verifying_key()),
            Err(Fault::WrongKey { .. })
        ));
        // A signature by another key that claims the trusted key's id.
        let mut forged = sign(&other, b"manifest");
        forged.key_id = key_id(&key.verifying_key());
        let forged = serde_json::to_vec(&forged).unwrap();
        assert!(matches!(
            check(&forged, b"manifest", &key.verifying_key()),
            Err(Fault::Signature(_))
        ));
        assert!(check(b"{}", b"manifest", &key.verifying_key()).is_err());
    }

    #[test]
    fn a_generated_pair_round_trips_through_pem_files() {
        let dir = tempfile::tempdir().unwrap();
        let private = dir.path().join("k.pem");
        let key = generate().unwrap();
        let public = write_pair(&key, &private).unwrap();
        assert_eq!(public, dir.path().join("k.pub.pem"));
        assert_eq!(
            read_private_key(&private).unwrap().to_bytes(),
            key.to_bytes()
        );
        assert_eq!(read_public_key(&public).unwrap(), key.verifying_key());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&private).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        assert!(
            write_pair(&key, &private).is_err(),
            "never overwrites a key"
        );
        assert!(read_public_key(&private).is_err());
    }

    /// Keys made by OpenSSL (installed on the build machines) sign and verify here, and ours
    /// are read by OpenSSL.
    #[test]
    fn keys_interoperate_with_openssl() {
        let dir = tempfile::tempdir().unwrap();
        let private = dir.path().join("ossl.pem");
        let public = dir.path().join("ossl.pub.pem");
        let run = |args: &[&str]| {
            let out = std::process::Command::new("openssl")
                .args(args)
                .output()
                .expect("openssl is installed");
            assert!(out.status.success(), "openssl {args:?}: {out:?}");
        };
        let p = |p: &Path| p.to_string_lossy().into_owned();
        run(&["genpkey", "-algorithm", "ed25519", "-out", &p(&private)]);
        run(&["pkey", "-in", &p(&private), "-pubout", "-out", &p(&public)]);
        let key = read_private_key(&private).unwrap();
        let trusted = read_public_key(&public).unwrap();
        assert_eq!(key.verifying_key(), trusted);
        let sig = serde_json::to_vec(&sign(&key, b"m")).unwrap();
        check(&sig, b"m", &trusted).unwrap();
        // Ours, read back by OpenSSL: it derives the same public key.
        let ours = dir.path().join("ours.pem");
        let ours_public = write_pair(&generate().unwrap(), &ours).unwrap();
        let derived = dir.path().join("derived.pub.pem");
        run(&["pkey", "-in", &p(&ours), "-pubout", "-out", &p(&derived)]);
        assert_eq!(
            std::fs::read_to_string(derived).unwrap(),
            std::fs::read_to_string(ours_public).unwrap()
        );
    }
}
