//! `hunch bundle build | keygen | inspect`: make, sign and look into the policy bundles that
//! `hunch serve --bundle-url` follows (docs/deploy.md, "Policy bundles").

use crate::policy::bundle::{self, format, keys, verify};
use clap::Subcommand;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Debug, Subcommand)]
pub enum BundleCommand {
    /// Pack a policy directory (NAME.wasm, NAME.toml, NAME.candidate.wasm, NAME.candidate.toml,
    /// and the calibration files *.json its TOML files name) into a bundle with a manifest (revision, sha256 of every file) and, with --signing-key,
    /// an ed25519 signature.
    #[command(after_help = "Example:
  hunch bundle build policies-dir -o policies.tar.gz --revision r7 --signing-key bundle.pem

Publish the file on any static HTTP server; replicas follow it with
  hunch serve --bundle-url https://host/policies.tar.gz --bundle-public-key bundle.pub.pem")]
    Build {
        /// The policy directory.
        dir: PathBuf,
        /// The bundle file to write.
        #[arg(short, long, value_name = "FILE")]
        output: PathBuf,
        /// The revision replicas report (default: `sha256:` and 12 hex digits of the content, so
        /// the same files make the same revision).
        #[arg(long, value_name = "REV")]
        revision: Option<String>,
        /// The ed25519 private key (PKCS#8 PEM: `hunch bundle keygen`, or `openssl genpkey
        /// -algorithm ed25519`) to sign the bundle with.
        #[arg(long, value_name = "KEY")]
        signing_key: Option<PathBuf>,
    },
    /// Write a new ed25519 key pair: KEY.pem (private, mode 0600) and KEY.pub.pem (public).
    Keygen {
        /// The private key file to create (never overwritten).
        #[arg(short, long, value_name = "KEY.pem")]
        output: PathBuf,
    },
    /// Print a bundle's revision and files and check its digests and, with --public-key, its
    /// signature. Exits 1 when a check fails.
    Inspect {
        /// The bundle file.
        file: PathBuf,
        /// The public key (SPKI PEM) the signature must verify with.
        #[arg(long, value_name = "KEY")]
        public_key: Option<PathBuf>,
    },
}

pub fn main(command: BundleCommand) -> ExitCode {
    let result = match command {
        BundleCommand::Build {
            dir,
            output,
            revision,
            signing_key,
        } => build(&dir, &output, revision, signing_key.as_deref()),
        BundleCommand::Keygen { output } => keygen(&output),
        BundleCommand::Inspect { file, public_key } => inspect(&file, public_key.as_deref()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("hunch: {message}");
            ExitCode::FAILURE
        }
    }
}

fn build(
    dir: &Path,
    output: &Path,
    revision: Option<String>,
    signing_key: Option<&Path>,
) -> Result<(), String> {
    let key = signing_key
        .map(keys::read_private_key)
        .transpose()
        .map_err(|e| e.to_string())?;
    let built = bundle::build(dir, revision, key.as_ref()).map_err(|e| e.to_string())?;
    for skipped in &built.skipped {
        eprintln!("hunch: skipped {skipped} (not a policy file of a bundle)");
    }
    // Written beside the target and renamed: a web server never serves half a bundle.
    let tmp = output.with_file_name(format!(
        ".{}.tmp",
        output
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    ));
    std::fs::write(&tmp, &built.bytes)
        .and_then(|()| std::fs::rename(&tmp, output))
        .map_err(|e| format!("cannot write {}: {e}", output.display()))?;
    println!(
        "{}: revision {}, {} file{}, {}, {} bytes",
        output.display(),
        built.manifest.revision,
        built.manifest.files.len(),
        if built.manifest.files.len() == 1 {
            ""
        } else {
            "s"
        },
        match &key {
            Some(k) => format!("signed by key {}", keys::key_id(&k.verifying_key())),
            None => "unsigned".to_string(),
        },
        built.bytes.len()
    );
    Ok(())
}

fn keygen(output: &Path) -> Result<(), String> {
    let key = keys::generate().map_err(|e| e.to_string())?;
    let public = keys::write_pair(&key, output).map_err(|e| e.to_string())?;
    println!(
        "private key {} (keep it secret), public key {} (key id {})",
        output.display(),
        public.display(),
        keys::key_id(&key.verifying_key())
    );
    Ok(())
}

fn inspect(file: &Path, public_key: Option<&Path>) -> Result<(), String> {
    let bytes = std::fs::read(file).map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    let trusted = public_key
        .map(keys::read_public_key)
        .transpose()
        .map_err(|e| e.to_string())?;
    let unpacked = format::unpack(&bytes).map_err(|e| e.to_string())?;
    let signature: Option<format::SignatureFile> = unpacked
        .signature_bytes
        .as_deref()
        .and_then(|s| serde_json::from_slice(s).ok());
    let trust = match &trusted {
        Some(key) => verify::Trust::Key(*key),
        None => verify::Trust::Unsigned,
    };
    let verified = verify::verify(unpacked, &trust).map_err(|e| e.to_string())?;
    println!("revision    {}", verified.manifest.revision);
    println!("created_at  {}", verified.manifest.created_at);
    println!(
        "signature   {}",
        match (&signature, &trusted) {
            (None, _) => "none (unsigned)".to_string(),
            (Some(s), Some(_)) => format!("ed25519, key {}: verified", s.key_id),
            (Some(s), None) => format!("ed25519, key {}: not checked (no --public-key)", s.key_id),
        }
    );
    println!("files       (sha256 and size checked)");
    for f in &verified.manifest.files {
        println!("  {:<40} {:>10} bytes  {}", f.path, f.size, f.sha256);
    }
    println!(
        "policies    {}",
        verified
            .policies
            .iter()
            .map(|p| match p.candidate {
                Some(_) => format!("{} (+candidate)", p.name),
                None => p.name.clone(),
            })
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(())
}
