//! Checking an unpacked bundle before anything of it runs: the manifest parses, the signature
//! over the manifest's exact bytes verifies with the trusted key (when one is configured),
//! every listed file is there with its size and sha256, no file is unlisted, and the files form
//! policies (every candidate and configuration beside its component).

use super::error::{BundleError, Fault};
use super::format::{calibration_file, parse_rfc3339_ms, policy_file, Manifest, Unpacked};
use super::keys;
use crate::policy::registry::{Stage, StagedPolicy, Version};
use ed25519_dalek::VerifyingKey;
use std::collections::{BTreeMap, BTreeSet};

/// What a server accepts.
#[derive(Debug, Clone)]
pub enum Trust {
    /// Only bundles signed by this key.
    Key(VerifyingKey),
    /// Any bundle, signed or not (`--bundle-allow-unsigned` without a public key): digests are
    /// still checked, but anyone who can serve the URL decides the policies.
    Unsigned,
}

/// A bundle that passed every check.
#[derive(Debug, Clone)]
pub struct Verified {
    pub manifest: Manifest,
    /// `created_at` in Unix milliseconds.
    pub created_at_ms: i64,
    pub signed: bool,
    pub policies: Vec<StagedPolicy>,
}

impl Verified {
    pub fn revision(&self) -> &str {
        &self.manifest.revision
    }
}

pub fn verify(unpacked: Unpacked, trust: &Trust) -> Result<Verified, BundleError> {
    let manifest_bytes = unpacked.manifest_bytes.ok_or(Fault::NoManifest)?;
    let manifest: Manifest =
        serde_json::from_slice(&manifest_bytes).map_err(|e| Fault::Manifest(e.to_string()))?;
    let revision = manifest.revision.clone();
    let fail = |fault: Fault| BundleError::new(Some(&revision), fault);
    if revision.trim().is_empty() || revision.len() > 128 || revision.chars().any(char::is_control)
    {
        return Err(Fault::Manifest(format!(
            "revision {revision:?} must be 1-128 printable characters"
        ))
        .into());
    }
    let created_at_ms = parse_rfc3339_ms(&manifest.created_at).ok_or_else(|| {
        fail(Fault::Manifest(format!(
            "created_at {:?} is not an RFC 3339 timestamp",
            manifest.created_at
        )))
    })?;
    // The signature first: nothing the manifest says is believed before it verifies.
    let signed = unpacked.signature_bytes.is_some();
    if let Trust::Key(key) = trust {
        let signature = unpacked
            .signature_bytes
            .as_deref()
            .ok_or(fail(Fault::Unsigned))?;
        keys::check(signature, &manifest_bytes, key).map_err(fail)?;
    }
    let mut files = unpacked.files;
    let mut listed = BTreeSet::new();
    let mut checked = BTreeMap::new();
    for entry in &manifest.files {
        if !listed.insert(entry.path.clone()) {
            return Err(fail(Fault::Manifest(format!(
                "{} is listed twice",
                entry.path
            ))));
        }
        let bytes = files
            .remove(&entry.path)
            .ok_or_else(|| fail(Fault::Missing(entry.path.clone())))?;
        if bytes.len() as u64 != entry.size {
            return Err(fail(Fault::Size {
                path: entry.path.clone(),
                expected: entry.size,
                actual: bytes.len() as u64,
            }));
        }
        let actual = super::format::sha256_hex(&bytes);
        if !actual.eq_ignore_ascii_case(&entry.sha256) {
            return Err(fail(Fault::Digest {
                path: entry.path.clone(),
                expected: short(&entry.sha256),
                actual: short(&actual),
            }));
        }
        checked.insert(entry.path.clone(), bytes);
    }
    if let Some(path) = files.into_keys().next() {
        return Err(fail(Fault::Unlisted(path)));
    }
    let policies = group(checked).map_err(fail)?;
    Ok(Verified {
        manifest,
        created_at_ms,
        signed,
        policies,
    })
}

/// A digest as an error message shows it: enough to tell two apart.
fn short(hex: &str) -> String {
    match hex.get(..12) {
        Some(prefix) if hex.len() > 12 => format!("{prefix}…"),
        _ => hex.to_string(),
    }
}

/// The bundle's files as policies: `NAME.wasm` (+ `NAME.toml`), and a candidate from
/// `NAME.candidate.wasm` with `NAME.candidate.toml`, else the active version's configuration
/// (as in a policy directory). The calibration files (`*.json`) go with every version, which
/// takes the one its configuration names.
fn group(mut files: BTreeMap<String, Vec<u8>>) -> Result<Vec<StagedPolicy>, Fault> {
    let calibrations: std::sync::Arc<BTreeMap<String, Vec<u8>>> = std::sync::Arc::new(
        files
            .extract_if(.., |path, _| calibration_file(path))
            .collect(),
    );
    #[derive(Default)]
    struct Parts {
        wasm: Option<Vec<u8>>,
        toml: Option<String>,
        candidate_wasm: Option<Vec<u8>>,
        candidate_toml: Option<String>,
    }
    let mut by_name: BTreeMap<String, Parts> = BTreeMap::new();
    for (path, bytes) in files {
        let Some((name, stage, ext)) = policy_file(&path) else {
            return Err(Fault::Layout {
                path,
                why: "not a policy file (NAME.wasm, NAME.toml, NAME.candidate.wasm, NAME.candidate.toml) or a calibration file (*.json)".into(),
            });
        };
        let parts = by_name.entry(name.to_string()).or_default();
        let text = |bytes: Vec<u8>| {
            String::from_utf8(bytes).map_err(|_| Fault::Layout {
                path: path.clone(),
                why: "not UTF-8 text".into(),
            })
        };
        match (stage, ext) {
            (Stage::Active, "wasm") => parts.wasm = Some(bytes),
            (Stage::Active, _) => parts.toml = Some(text(bytes)?),
            (_, "wasm") => parts.candidate_wasm = Some(bytes),
            _ => parts.candidate_toml = Some(text(bytes)?),
        }
    }
    let mut policies = Vec::new();
    for (name, parts) in by_name {
        let Some(wasm) = parts.wasm else {
            let path = if parts.candidate_wasm.is_some() {
                format!("{name}.candidate.wasm")
            } else if parts.toml.is_some() {
                format!("{name}.toml")
            } else {
                format!("{name}.candidate.toml")
            };
            return Err(Fault::Layout {
                path,
                why: format!("no {name}.wasm beside it"),
            });
        };
        let candidate = match (parts.candidate_wasm, parts.candidate_toml) {
            (Some(wasm), toml) => Some(Version {
                wasm,
                toml: toml.or_else(|| parts.toml.clone()),
                calibrations: calibrations.clone(),
            }),
            (None, Some(_)) => {
                return Err(Fault::Layout {
                    path: format!("{name}.candidate.toml"),
                    why: format!("no {name}.candidate.wasm beside it"),
                })
            }
            (None, None) => None,
        };
        policies.push(StagedPolicy {
            name,
            active: Version {
                wasm,
                toml: parts.toml,
                calibrations: calibrations.clone(),
            },
            candidate,
        });
    }
    Ok(policies)
}

#[cfg(test)]
mod tests {
    use super::super::format::{manifest_of, pack, unpack};
    use super::*;
    use ed25519_dalek::SigningKey;

    const CREATED: &str = "2026-12-01T18:00:00.000Z";

    fn files() -> BTreeMap<String, Vec<u8>> {
        BTreeMap::from([
            ("ticket_router.wasm".to_string(), b"active".to_vec()),
            (
                "ticket_router.toml".to_string(),
                b"reader = \"m\"\n".to_vec(),
            ),
            (
                "ticket_router.candidate.wasm".to_string(),
                b"candidate".to_vec(),
            ),
        ])
    }

    fn key(seed: u8) -> SigningKey {
        SigningKey::from_bytes(&[seed; 32])
    }

    /// A bundle of `files` whose manifest lists `listed`, signed by `signer`.
    fn bundle(
        listed: &BTreeMap<String, Vec<u8>>,
        files: &BTreeMap<String, Vec<u8>>,
        signer: Option<&SigningKey>,
    ) -> Unpacked {
        let manifest =
            serde_json::to_vec(&manifest_of(listed, "r7".into(), CREATED.into())).unwrap();
        let signature = signer.map(|k| serde_json::to_vec(&keys::sign(k, &manifest)).unwrap());
        unpack(&pack(&manifest, signature.as_deref(), files).unwrap()).unwrap()
    }

    fn trusted() -> Trust {
        Trust::Key(key(1).verifying_key())
    }

    #[test]
    fn a_signed_bundle_verifies_and_groups_its_policies() {
        let v = verify(bundle(&files(), &files(), Some(&key(1))), &trusted()).unwrap();
        assert_eq!(v.revision(), "r7");
        assert!(v.signed);
        assert_eq!(v.policies.len(), 1);
        let p = &v.policies[0];
        assert_eq!(p.name, "ticket_router");
        assert_eq!(p.active.wasm, b"active");
        let candidate = p.candidate.as_ref().unwrap();
        assert_eq!(candidate.wasm, b"candidate");
        assert_eq!(
            candidate.toml.as_deref(),
            Some("reader = \"m\"\n"),
            "a candidate without its own config takes the active one's"
        );
    }

    #[test]
    fn fields_another_tool_writes_into_the_manifest_and_signature_are_ignored() {
        let mut manifest =
            serde_json::to_value(manifest_of(&files(), "r7".into(), CREATED.into())).unwrap();
        manifest["roots"] = serde_json::json!(["ticket_router"]);
        manifest["metadata"] = serde_json::json!({"built_by": "ci"});
        manifest["files"][0]["mode"] = serde_json::json!("0644");
        let manifest = serde_json::to_vec(&manifest).unwrap();
        let mut signature = serde_json::to_value(keys::sign(&key(1), &manifest)).unwrap();
        signature["comment"] = serde_json::json!("release key");
        let signature = serde_json::to_vec(&signature).unwrap();
        let bundle = unpack(&pack(&manifest, Some(&signature), &files()).unwrap()).unwrap();
        let verified = verify(bundle, &trusted()).unwrap();
        assert!(verified.signed);
        assert_eq!(verified.revision(), "r7");
    }

    #[test]
    fn a_tampered_file_fails_its_digest_naming_file_and_digests() {
        let mut tampered = files();
        tampered.insert("ticket_router.wasm".into(), b"activE".to_vec());
        let err = verify(bundle(&files(), &tampered, Some(&key(1))), &trusted()).unwrap_err();
        assert!(matches!(err.fault, Fault::Digest { .. }), "{err}");
        let text = err.to_string();
        assert!(
            text.starts_with("bundle r7: ticket_router.wasm: sha256 mismatch (manifest "),
            "{text}"
        );
        assert_eq!(err.reason().as_str(), "digest");
    }

    #[test]
    fn a_missing_file_and_an_unlisted_file_are_refused() {
        let mut fewer = files();
        fewer.remove("ticket_router.toml");
        let err = verify(bundle(&files(), &fewer, Some(&key(1))), &trusted()).unwrap_err();
        assert_eq!(err.fault, Fault::Missing("ticket_router.toml".into()));
        assert_eq!(err.reason().as_str(), "missing");
        let mut more = files();
        more.insert("extra.wasm".into(), b"sneaked in".to_vec());
        let err = verify(bundle(&files(), &more, Some(&key(1))), &trusted()).unwrap_err();
        assert_eq!(err.fault, Fault::Unlisted("extra.wasm".into()));
        assert_eq!(err.reason().as_str(), "unlisted");
    }

    #[test]
    fn a_wrong_key_or_no_signature_is_refused_when_a_key_is_required() {
        let err = verify(bundle(&files(), &files(), Some(&key(2))), &trusted()).unwrap_err();
        assert!(matches!(err.fault, Fault::WrongKey { .. }), "{err}");
        let err = verify(bundle(&files(), &files(), None), &trusted()).unwrap_err();
        assert_eq!(err.fault, Fault::Unsigned);
        assert_eq!(err.reason().as_str(), "signature");
        // Allowed unsigned: digests still count.
        let v = verify(bundle(&files(), &files(), None), &Trust::Unsigned).unwrap();
        assert!(!v.signed);
        let mut tampered = files();
        tampered.insert("ticket_router.toml".into(), b"x".to_vec());
        assert!(verify(bundle(&files(), &tampered, None), &Trust::Unsigned).is_err());
    }

    #[test]
    fn a_manifest_changed_after_signing_is_refused() {
        let manifest =
            serde_json::to_vec(&manifest_of(&files(), "r7".into(), CREATED.into())).unwrap();
        let signature = serde_json::to_vec(&keys::sign(&key(1), &manifest)).unwrap();
        let edited = String::from_utf8(manifest).unwrap().replace("r7", "r8");
        let unpacked =
            unpack(&pack(edited.as_bytes(), Some(&signature), &files()).unwrap()).unwrap();
        let err = verify(unpacked, &trusted()).unwrap_err();
        assert!(matches!(err.fault, Fault::Signature(_)), "{err}");
    }

    #[test]
    fn files_that_are_not_policies_are_refused() {
        for (path, why) in [
            ("notes.txt", "not a policy file"),
            ("a.previous.wasm", "not a policy file"),
            ("b.candidate.wasm", "no b.wasm"),
            ("c.toml", "no c.wasm"),
        ] {
            let mut odd = files();
            odd.insert(path.into(), b"x".to_vec());
            let err = verify(bundle(&odd, &odd, Some(&key(1))), &trusted()).unwrap_err();
            assert!(err.to_string().contains(why), "{path}: {err}");
        }
        let err = verify(
            Unpacked {
                manifest_bytes: None,
                signature_bytes: None,
                files: files(),
            },
            &trusted(),
        )
        .unwrap_err();
        assert_eq!(err.fault, Fault::NoManifest);
    }
}
