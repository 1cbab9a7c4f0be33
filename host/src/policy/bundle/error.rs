//! Why a bundle was refused: one typed error that names the revision (when known), the file and
//! what is wrong with it, and the reason label `/metrics` counts it under.

/// A refused bundle: its revision when the manifest was read, and the fault.
#[derive(Debug, Clone, PartialEq)]
pub struct BundleError {
    pub revision: Option<String>,
    pub fault: Fault,
}

impl std::fmt::Display for BundleError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.revision {
            Some(r) => write!(f, "bundle {r}: {}", self.fault),
            None => write!(f, "bundle: {}", self.fault),
        }
    }
}

impl std::error::Error for BundleError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.fault)
    }
}

impl BundleError {
    pub fn new(revision: Option<&str>, fault: Fault) -> Self {
        BundleError {
            revision: revision.map(str::to_string),
            fault,
        }
    }

    /// The `reason` label of `hunch_bundle_failures_total`.
    pub fn reason(&self) -> Reason {
        self.fault.reason()
    }
}

impl From<Fault> for BundleError {
    fn from(fault: Fault) -> Self {
        BundleError {
            revision: None,
            fault,
        }
    }
}

/// What is wrong with a bundle.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Fault {
    /// The bundle server could not be reached or did not answer 200/304.
    #[error("download failed: {0}")]
    Download(String),
    #[error("larger than the {limit}-byte bound on a bundle ({what})")]
    TooLarge { what: &'static str, limit: u64 },
    /// Not a complete gzip tar: a truncated download, a corrupt stream, an odd entry.
    #[error("not a readable bundle (truncated download or corrupt gzip/tar): {0}")]
    Corrupt(String),
    #[error("the manifest (.manifest) is missing")]
    NoManifest,
    #[error("the manifest (.manifest) is not valid: {0}")]
    Manifest(String),
    #[error("unsigned (no .signature), and this server requires a signature")]
    Unsigned,
    #[error("signed with key {found}, but the configured public key is {expected}")]
    WrongKey { found: String, expected: String },
    #[error("the signature (.signature) is not valid: {0}")]
    Signature(String),
    #[error("{path}: sha256 mismatch (manifest {expected}, file {actual})")]
    Digest {
        path: String,
        expected: String,
        actual: String,
    },
    #[error("{path}: size mismatch (manifest {expected} bytes, file {actual} bytes)")]
    Size {
        path: String,
        expected: u64,
        actual: u64,
    },
    #[error("{0}: in the bundle but not listed in the manifest")]
    Unlisted(String),
    #[error("{0}: listed in the manifest but not in the bundle")]
    Missing(String),
    /// A file a bundle may not hold, or a candidate or config without its component.
    #[error("{path}: {why}")]
    Layout { path: String, why: String },
    #[error("older than the active revision {active} (created {created_at}, active created {active_created_at})")]
    Older {
        created_at: String,
        active: String,
        active_created_at: String,
    },
    #[error("policy {policy} ({stage}) does not load: {message}")]
    Compile {
        policy: String,
        stage: &'static str,
        message: String,
    },
    #[error("cannot persist the bundle: {0}")]
    Persist(String),
}

/// The failure reasons `/metrics` counts, each always rendered (0 included).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Reason {
    Download,
    Signature,
    Digest,
    Unlisted,
    Missing,
    Older,
    Compile,
    Persist,
}

impl Reason {
    pub const ALL: [Reason; 8] = [
        Reason::Download,
        Reason::Signature,
        Reason::Digest,
        Reason::Unlisted,
        Reason::Missing,
        Reason::Older,
        Reason::Compile,
        Reason::Persist,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Download => "download",
            Reason::Signature => "signature",
            Reason::Digest => "digest",
            Reason::Unlisted => "unlisted",
            Reason::Missing => "missing",
            Reason::Older => "older",
            Reason::Compile => "compile",
            Reason::Persist => "persist",
        }
    }
}

impl Fault {
    pub fn reason(&self) -> Reason {
        match self {
            // What arrived is not a bundle at all: as good as no download.
            Fault::Download(_)
            | Fault::TooLarge { .. }
            | Fault::Corrupt(_)
            | Fault::Manifest(_) => Reason::Download,
            Fault::NoManifest | Fault::Missing(_) => Reason::Missing,
            Fault::Unsigned | Fault::WrongKey { .. } | Fault::Signature(_) => Reason::Signature,
            Fault::Digest { .. } | Fault::Size { .. } => Reason::Digest,
            Fault::Unlisted(_) | Fault::Layout { .. } => Reason::Unlisted,
            Fault::Older { .. } => Reason::Older,
            Fault::Compile { .. } => Reason::Compile,
            Fault::Persist(_) => Reason::Persist,
        }
    }
}
