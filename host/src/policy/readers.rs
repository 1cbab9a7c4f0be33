//! Where policies' reads go: the readers a server names, the default among them, and the
//! answer and calibration settings their reads are given.

use std::collections::BTreeMap;
use std::sync::Arc;

use hunch_core::Reader;

use crate::calibration::file::Calibrations;

/// Where policies' reads go: the server's readers by name.
pub trait ReaderSource: Send + Sync {
    /// `None` asks for the default reader.
    fn reader(&self, name: Option<&str>) -> Option<Arc<dyn Reader>>;

    /// The reader a shadow run reads with: by default the live one; the server's reads at
    /// background priority, admitted only when no live read waits.
    fn shadow_reader(&self, name: Option<&str>) -> Option<Arc<dyn Reader>> {
        self.reader(name)
    }

    /// The server's question mode and answer cache for policy reads. Required, so that no
    /// source of readers can forget the server's settings.
    fn answering(&self) -> hunch_core::AnswerSettings;

    /// The server's calibration now (`--calibration`), which a policy's reads use unless its
    /// `NAME.toml` names its own or turns it off. Required for the same reason.
    fn calibration(&self) -> Option<Arc<Calibrations>>;
}

/// A fixed set of readers: a default and named ones, asked with fixed answer settings.
pub struct StaticReaders {
    pub default: Option<Arc<dyn Reader>>,
    pub named: BTreeMap<String, Arc<dyn Reader>>,
    pub answering: hunch_core::AnswerSettings,
    pub calibration: Option<Arc<Calibrations>>,
}

impl StaticReaders {
    pub fn single(reader: Arc<dyn Reader>) -> Self {
        StaticReaders {
            default: Some(reader),
            named: BTreeMap::new(),
            answering: hunch_core::AnswerSettings::default(),
            calibration: None,
        }
    }
}

impl ReaderSource for StaticReaders {
    fn reader(&self, name: Option<&str>) -> Option<Arc<dyn Reader>> {
        match name {
            None => self.default.clone(),
            Some(n) => self
                .named
                .get(n)
                .cloned()
                .or_else(|| self.default.clone().filter(|r| r.model_name() == n)),
        }
    }

    fn answering(&self) -> hunch_core::AnswerSettings {
        self.answering.clone()
    }

    fn calibration(&self) -> Option<Arc<Calibrations>> {
        self.calibration.clone()
    }
}
