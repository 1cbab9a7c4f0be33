//! The policy bundle settings (`--bundle-*`, `HUNCH_BUNDLE_*`, the file's `[bundle]` table): each
//! source gives a [`BundleLayer`]; layers merge setting by setting like every other setting, and
//! [`resolve`] checks the result into the policy layer's [`BundleSettings`].

use super::ConfigError;
use crate::policy::bundle::{BundleSettings, DEFAULT_POLL};
use serde::Deserialize;
use std::path::PathBuf;
use std::time::Duration;

/// `[bundle]` of the file, or what the flags or the environment set.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BundleLayer {
    pub url: Option<String>,
    pub public_key: Option<PathBuf>,
    pub poll: Option<Span>,
    pub dir: Option<PathBuf>,
    pub stale_after: Option<Span>,
    pub allow_unsigned: Option<bool>,
}

impl BundleLayer {
    /// `None` when nothing is set, so an empty layer is the absence of one.
    pub fn some(self) -> Option<BundleLayer> {
        (self != BundleLayer::default()).then_some(self)
    }

    /// Each setting from `upper` where it is set, else from `lower`.
    pub fn over(upper: Option<BundleLayer>, lower: Option<BundleLayer>) -> Option<BundleLayer> {
        let (u, l) = (upper.unwrap_or_default(), lower.unwrap_or_default());
        BundleLayer {
            url: u.url.or(l.url),
            public_key: u.public_key.or(l.public_key),
            poll: u.poll.or(l.poll),
            dir: u.dir.or(l.dir),
            stale_after: u.stale_after.or(l.stale_after),
            allow_unsigned: u.allow_unsigned.or(l.allow_unsigned),
        }
        .some()
    }
}

/// A duration: `10s`, `500ms`, `2m`, `1h`, or a number of seconds (TOML may also give a bare
/// number).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Span(pub Duration);

impl std::str::FromStr for Span {
    type Err = ConfigError;

    fn from_str(text: &str) -> Result<Span, ConfigError> {
        hunch_core::duration::parse(text)
            .filter(|d| !d.is_zero())
            .map(Span)
            .ok_or_else(|| {
                ConfigError::Invalid(format!(
                    "{text:?} is not a duration (e.g. 10s, 500ms, 2m, or seconds)"
                ))
            })
    }
}

impl<'de> Deserialize<'de> for Span {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Span, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Seconds(f64),
            Text(String),
        }
        let text = match Raw::deserialize(d)? {
            Raw::Seconds(s) => s.to_string(),
            Raw::Text(t) => t,
        };
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// The bundle settings, or `None` without a URL (the other settings alone do nothing: the
/// image sets `HUNCH_BUNDLE_DIR` for every container).
pub fn resolve(layer: Option<BundleLayer>) -> Result<Option<BundleSettings>, ConfigError> {
    let layer = layer.unwrap_or_default();
    let Some(url) = layer.url.filter(|u| !u.trim().is_empty()) else {
        return Ok(None);
    };
    crate::http_url::check("--bundle-url", &url)
        .map_err(|e| ConfigError::Invalid(e.to_string()))?;
    let allow_unsigned = layer.allow_unsigned.unwrap_or(false);
    if layer.public_key.is_none() && !allow_unsigned {
        return Err(ConfigError::Invalid(
            "--bundle-url needs --bundle-public-key (the key bundles are signed with), or \
             --bundle-allow-unsigned to accept unsigned bundles from that URL"
                .into(),
        ));
    }
    let poll = layer.poll.map(|s| s.0).unwrap_or(DEFAULT_POLL);
    Ok(Some(BundleSettings {
        url,
        public_key: layer.public_key,
        allow_unsigned,
        poll,
        stale_after: layer.stale_after.map(|s| s.0).unwrap_or(poll * 3),
        dir: layer.dir,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_with_units_or_as_seconds() {
        let d = |t: &str| t.parse::<Span>().map(|s| s.0);
        assert_eq!(d("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(d("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(d("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(d("1.5").unwrap(), Duration::from_millis(1500));
        for bad in ["", "0", "-1s", "ten", "5 days", "10x"] {
            assert!(d(bad).is_err(), "{bad}");
        }
        let from_toml: BundleLayer = toml::from_str("poll = 3\nstale_after = \"1m\"").unwrap();
        assert_eq!(from_toml.poll, Some(Span(Duration::from_secs(3))));
        assert_eq!(from_toml.stale_after, Some(Span(Duration::from_secs(60))));
    }

    #[test]
    fn a_url_needs_a_key_or_an_explicit_unsigned() {
        let url = |extra: BundleLayer| {
            resolve(Some(BundleLayer {
                url: Some("http://b/bundle.tar.gz".into()),
                ..extra
            }))
        };
        let err = url(BundleLayer::default()).unwrap_err();
        assert!(err.to_string().contains("--bundle-public-key"), "{err}");
        let s = url(BundleLayer {
            allow_unsigned: Some(true),
            ..Default::default()
        })
        .unwrap()
        .unwrap();
        assert_eq!(s.poll, Duration::from_secs(10));
        assert_eq!(
            s.stale_after,
            Duration::from_secs(30),
            "3 × poll by default"
        );
        let s = url(BundleLayer {
            public_key: Some("/k.pub.pem".into()),
            poll: Some(Span(Duration::from_secs(2))),
            ..Default::default()
        })
        .unwrap()
        .unwrap();
        assert_eq!(s.stale_after, Duration::from_secs(6));
        assert!(resolve(Some(BundleLayer {
            url: Some("ftp://b".into()),
            allow_unsigned: Some(true),
            ..Default::default()
        }))
        .is_err());
        // Without a URL the rest is inert.
        let dir_only = BundleLayer {
            dir: Some("/var/lib/hunch/bundle".into()),
            ..Default::default()
        };
        assert_eq!(resolve(Some(dir_only)).unwrap(), None);
    }

    #[test]
    fn layers_merge_setting_by_setting() {
        let flags = BundleLayer {
            url: Some("http://flag".into()),
            ..Default::default()
        };
        let file = BundleLayer {
            url: Some("http://file".into()),
            dir: Some("/d".into()),
            ..Default::default()
        };
        let merged = BundleLayer::over(Some(flags), Some(file)).unwrap();
        assert_eq!(merged.url.as_deref(), Some("http://flag"));
        assert_eq!(merged.dir, Some(PathBuf::from("/d")));
        assert_eq!(BundleLayer::over(None, None), None);
    }
}
