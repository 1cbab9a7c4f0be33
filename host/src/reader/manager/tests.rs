//! The manager's bookkeeping without a real sidecar (tests/tests/model_budget.rs runs real
//! ones): discovery and rescans, the 507 decision, single-flight loads, unloads refused or
//! answered, what the snapshot says.

use super::*;
use crate::metrics::MetricsSource;
use hunch_core::ReadError;

/// A GGUF file of `bytes` bytes (the magic, then zeros): discovered and sized by its length.
pub(super) fn gguf(dir: &std::path::Path, name: &str, bytes: usize) {
    let mut data = b"GGUF".to_vec();
    data.resize(bytes, 0);
    std::fs::write(dir.join(format!("{name}.gguf")), data).unwrap();
}

pub(super) fn settings(dir: &std::path::Path, budget: u64) -> ManagerSettings {
    ManagerSettings {
        budget_bytes: budget,
        models_dirs: vec![dir.to_path_buf()],
        ttl: Duration::from_secs(300),
        wait: Duration::from_secs(5),
        // No such binary: every load fails, which is what these tests look at.
        binary: dir.join("no-such-sidecar"),
        extra_args: Vec::new(),
        read_timeout: Duration::from_secs(5),
        reserved: vec!["taken".into()],
        model_args: Default::default(),
    }
}

#[tokio::test]
async fn discovered_models_are_available_and_rescans_notice_new_and_removed_ones() {
    let dir = tempfile::tempdir().unwrap();
    gguf(dir.path(), "a", 1000);
    gguf(dir.path(), "taken", 1000);
    std::fs::write(dir.path().join("notes.txt"), "no model").unwrap();
    let manager = ModelManager::new(settings(dir.path(), 10_000), Vec::new());
    let view = manager.view();
    assert_eq!(manager.names(), ["a"], "a reserved name is skipped");
    let a = view.model("a").unwrap();
    assert_eq!(a.state, ModelState::Available);
    assert_eq!(a.estimated_bytes, 1000);
    assert_eq!(a.resident_bytes, None);
    assert!(!a.pinned);
    assert!(view.skipped.iter().any(|(p, _)| p.ends_with("notes.txt")));

    // A model copied in is found on its first request, without waiting for the clock.
    gguf(dir.path(), "b", 2000);
    assert!(manager.contains("b"));
    std::fs::remove_file(dir.path().join("a.gguf")).unwrap();
    manager.rescan(true);
    assert_eq!(manager.names(), ["b"]);
}

#[tokio::test]
async fn a_model_that_can_never_fit_is_refused_at_once_naming_both_sizes() {
    let dir = tempfile::tempdir().unwrap();
    gguf(dir.path(), "big", 5000);
    gguf(dir.path(), "small", 100);
    let manager = ModelManager::new(settings(dir.path(), 4000), Vec::new());
    let refused = manager.check_fits("big").unwrap_err();
    assert_eq!(
        refused,
        LeaseError::NeverFits {
            model: "big".into(),
            needed: 5000,
            budget: 4000,
            pinned: 0
        }
    );
    let message = refused.to_string();
    assert!(
        message.contains("5000") && message.contains("4000"),
        "{message}"
    );
    // The lease says the same without waiting, and a reader reports it as no retry's business.
    let started = Instant::now();
    assert_eq!(manager.lease("big").await.err(), Some(refused.clone()));
    assert!(started.elapsed() < Duration::from_secs(1));
    assert!(matches!(
        refused.into_read_error(),
        ReadError::TooLarge { .. }
    ));
    assert!(manager.check_fits("small").is_ok());
    assert!(matches!(
        manager.check_fits("nope"),
        Err(LeaseError::NotFound(_))
    ));
}

#[tokio::test]
async fn pinned_models_count_against_what_can_ever_fit() {
    let dir = tempfile::tempdir().unwrap();
    gguf(dir.path(), "m", 3000);
    let pinned = vec![("p".to_string(), dir.path().join("p.gguf"), 2000)];
    let manager = ModelManager::new(settings(dir.path(), 4000), pinned);
    assert_eq!(
        manager.check_fits("m"),
        Err(LeaseError::NeverFits {
            model: "m".into(),
            needed: 3000,
            budget: 4000,
            pinned: 2000
        })
    );
    let view = manager.view();
    assert!(view.model("p").unwrap().pinned);
    assert_eq!(manager.unload("p"), Err(UnloadError::Pinned("p".into())));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_first_requests_start_one_load_and_share_its_failure() {
    let dir = tempfile::tempdir().unwrap();
    gguf(dir.path(), "m", 100);
    let manager = ModelManager::new(settings(dir.path(), 10_000), Vec::new());
    let leases: Vec<_> = (0..8)
        .map(|_| {
            let manager = manager.clone();
            tokio::spawn(async move { manager.lease("m").await.err() })
        })
        .collect();
    for lease in leases {
        let err = lease.await.unwrap();
        assert!(
            matches!(err, Some(LeaseError::Failed { .. })),
            "every request sees the one load's failure: {err:?}"
        );
    }
    let mut metrics = String::new();
    manager.render_metrics(&mut metrics);
    assert!(
        metrics.contains("hunch_model_loads_total{model=\"m\",outcome=\"failed\"} 1\n"),
        "{metrics}"
    );
    let view = manager.view();
    let m = view.model("m").unwrap();
    assert_eq!(m.state, ModelState::Failed);
    assert!(
        m.error.as_deref().unwrap_or("").contains("no-such-sidecar"),
        "{m:?}"
    );
    // A sidecar that cannot start is no refusal of the checkpoint: a retry may help.
    assert!(!m.refused, "{m:?}");
    // Within the cooldown a read is refused with the reason, no new load is tried.
    assert!(matches!(
        manager.lease("m").await,
        Err(LeaseError::Failed { .. })
    ));
    assert!(matches!(
        manager
            .lease("m")
            .await
            .err()
            .map(LeaseError::into_read_error),
        Some(ReadError::Unavailable { .. })
    ));
}

#[tokio::test]
async fn a_refused_load_is_a_409_naming_it_until_the_cooldown_then_loads_again() {
    let dir = tempfile::tempdir().unwrap();
    gguf(dir.path(), "zoom", 100);
    let manager = ModelManager::new(settings(dir.path(), 10_000), Vec::new());
    let why = "zoom.gguf: qwen2.attention.zoom = 2 is not a key Hunch knows for qwen2";
    let set_refused = |retry_at: Instant| {
        let mut inner = manager.lock();
        let slot = inner.models.get_mut("zoom").expect("zoom is discovered");
        slot.phase = Phase::Failed {
            why: why.into(),
            retry_at,
            refused: true,
        };
    };
    set_refused(Instant::now() + Duration::from_secs(60));
    let err = manager.lease("zoom").await.err();
    assert_eq!(
        err,
        Some(LeaseError::Refused {
            model: "zoom".into(),
            why: why.into()
        })
    );
    let ReadError::Rejected { status, message } = err.unwrap().into_read_error() else {
        panic!("a refusal is not passed through as a 4xx");
    };
    assert_eq!(status, crate::reader::sidecar::REFUSED_STATUS);
    for part in [
        "model zoom",
        "qwen2.attention.zoom",
        "/v1/models",
        "ignore_config_keys",
    ] {
        assert!(message.contains(part), "{part}: {message}");
    }
    let view = manager.view();
    let m = view.model("zoom").unwrap();
    assert_eq!(m.state, ModelState::Failed);
    assert!(m.refused, "{m:?}");
    assert_eq!(m.error.as_deref(), Some(why));

    // Past the cooldown the next read loads again (here it fails: no sidecar binary), so a
    // fixed file or setting takes effect; and that failure is not a refusal.
    set_refused(Instant::now());
    let err = manager.lease("zoom").await.err();
    assert!(matches!(err, Some(LeaseError::Failed { .. })), "{err:?}");
    assert!(!manager.view().model("zoom").unwrap().refused);
}

#[tokio::test]
async fn unloading_what_is_not_loaded_or_unknown_says_so() {
    let dir = tempfile::tempdir().unwrap();
    gguf(dir.path(), "m", 100);
    let manager = ModelManager::new(settings(dir.path(), 10_000), Vec::new());
    assert_eq!(manager.unload("m"), Ok(Unloaded::NotLoaded));
    assert_eq!(
        manager.unload("zz"),
        Err(UnloadError::NotFound("zz".into()))
    );
    // x_keep_alive on a model that is not loaded changes nothing.
    manager.keep_alive("m", Duration::ZERO);
    assert_eq!(
        manager.view().model("m").unwrap().state,
        ModelState::Available
    );
}

#[test]
fn the_metrics_name_the_budget_and_every_eviction_reason() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _guard = runtime.enter();
    let manager = ModelManager::new(settings(dir.path(), 4096), Vec::new());
    let mut out = String::new();
    manager.render_metrics(&mut out);
    assert!(out.contains("hunch_model_budget_bytes 4096\n"), "{out}");
    for reason in ["budget", "ttl", "keep_alive", "admin", "removed", "died"] {
        assert!(
            out.contains(&format!(
                "hunch_model_evictions_total{{reason=\"{reason}\"}} 0\n"
            )),
            "{reason}: {out}"
        );
    }
}

#[test]
fn a_load_that_is_not_done_names_its_time_left_and_retry_after_follows_it() {
    let loading = LeaseError::StillLoading {
        model: "m".into(),
        percent: 40.0,
        seconds_left: Some(11.2),
    };
    assert_eq!(
        loading.to_string(),
        "model m is still loading (40%, about 12 s left)"
    );
    assert!(matches!(
        loading.into_read_error(),
        ReadError::Unavailable {
            retry_after_seconds: 12,
            ..
        }
    ));
    // Unknown: no time named, a retry in 5 s.
    let unknown = LeaseError::StillLoading {
        model: "m".into(),
        percent: 0.0,
        seconds_left: None,
    };
    assert_eq!(unknown.to_string(), "model m is still loading (0%)");
    assert!(matches!(
        unknown.into_read_error(),
        ReadError::Unavailable {
            retry_after_seconds: 5,
            ..
        }
    ));
    // A long load is retried within a minute, whatever it has left.
    let long = LeaseError::StillLoading {
        model: "m".into(),
        percent: 1.0,
        seconds_left: Some(600.0),
    };
    assert!(matches!(
        long.into_read_error(),
        ReadError::Unavailable {
            retry_after_seconds: 60,
            ..
        }
    ));
}
