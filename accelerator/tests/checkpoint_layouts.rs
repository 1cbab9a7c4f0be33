//! Checkpoint directories written by others load by what their tensors are, and loads that
//! would not fit in memory are refused before allocating.
//!
//! - A directory with a foreign `manifest.json` (unknown keys, no `format`, `tensors` as
//!   name→file) and one with only the shards' headers read exactly like the same weights in
//!   Hunch's own layout.
//! - A float32 load whose widened weights exceed the memory limit is refused before MLX
//!   allocates anything; the same checkpoint loads with bfloat16 activations, which keep the
//!   weights as stored.

use std::path::Path;

use hunch_accelerator::checkpoint::{
    format::{INDEX, MANIFEST},
    Checkpoint, Layout, LoadError, MemoryPlan,
};
use hunch_accelerator::engine::{EngineOptions, MlxEngine};
use hunch_accelerator::tools::{write_random_checkpoint, Preset, RandomSpec};
use hunch_accelerator::{ActivationDtype, DiffusionGemma, LoadOptions};
use hunch_core::ReadRequest;
use serde_json::{json, Value};

/// MLX's memory counters are per process: tests that read them run one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn random(dir: &Path, layout: Layout) {
    let mut spec = RandomSpec::new(Preset::Tiny, layout);
    spec.seed = 1010;
    for kv in ["vocab_size=1024", "top.canvas_length=32"] {
        spec.set(kv).expect("override");
    }
    write_random_checkpoint(dir, &spec).expect("random checkpoint");
}

/// The answers of one read (distributions only: timings differ run to run).
fn read(dir: &Path) -> Value {
    let mut engine = MlxEngine::load(
        dir,
        &EngineOptions {
            probe_batching: false,
            ..EngineOptions::default()
        },
    )
    .unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let request: ReadRequest = serde_json::from_value(json!({
        "state": "My card was charged twice and the app crashes on the invoices page!",
        "questions": [
            {"type": "choice", "instructions": "Which team should handle this",
             "options": [{"name": "billing", "description": "Payments"},
                         {"name": "technical", "description": null}]},
            {"type": "noul", "instructions": "The message conveys urgency", "yes": null, "no": null}],
        "options": {}}))
    .expect("request");
    let outcome = engine.read(&request).expect("read");
    serde_json::to_value(&outcome.distributions).expect("json")
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read dir") {
        let entry = entry.expect("entry");
        std::fs::copy(entry.path(), to.join(entry.file_name())).expect("copy");
    }
}

#[test]
fn foreign_manifest_and_bare_shards_read_like_the_own_layout() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().expect("tmp");
    for layout in [Layout::Nvfp4, Layout::Affine, Layout::Hf] {
        let own = tmp.path().join(format!("{layout}-own"));
        random(&own, layout);
        let expected = read(&own);

        // Another exporter's manifest: its own keys, no format tag, tensors as name→file, and
        // no HF index beside it.
        let foreign = tmp.path().join(format!("{layout}-foreign"));
        copy_dir(&own, &foreign);
        let _ = std::fs::remove_file(foreign.join(INDEX));
        let c = Checkpoint::open(&own).expect("own");
        let tensors: serde_json::Map<String, Value> = c
            .tensors()
            .files()
            .iter()
            .flat_map(|f| {
                let file = f
                    .path()
                    .file_name()
                    .expect("name")
                    .to_string_lossy()
                    .to_string();
                f.names()
                    .map(move |n| (n.to_string(), Value::from(file.clone())))
                    .collect::<Vec<_>>()
            })
            .collect();
        let manifest =
            json!({"producer": "another exporter 0.3", "notes": ["x"], "tensors": tensors});
        std::fs::write(foreign.join(MANIFEST), manifest.to_string()).expect("manifest");
        assert_eq!(Checkpoint::open(&foreign).expect("foreign").layout, layout);
        assert_eq!(read(&foreign), expected, "{layout}: foreign manifest");

        // Neither index nor manifest: the shards' headers alone.
        let bare = tmp.path().join(format!("{layout}-bare"));
        copy_dir(&foreign, &bare);
        std::fs::remove_file(bare.join(MANIFEST)).expect("rm manifest");
        assert_eq!(Checkpoint::open(&bare).expect("bare").layout, layout);
        assert_eq!(read(&bare), expected, "{layout}: shard headers only");
        for d in [own, foreign, bare] {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

#[test]
fn a_float32_load_that_would_not_fit_is_refused_before_allocating() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("hf");
    random(&dir, Layout::Hf);
    let checkpoint = Checkpoint::open(&dir).expect("open");
    let bf16 = MemoryPlan::of(&checkpoint, ActivationDtype::Bfloat16.dtype());
    let f32 = MemoryPlan::of(&checkpoint, ActivationDtype::Float32.dtype());
    drop(checkpoint);
    // bf16 activations use the stored bf16 weights as they are; float32 widens every one.
    assert_eq!((bf16.allocated, bf16.mapped), (0, bf16.stored));
    assert_eq!(f32.allocated, 2 * f32.stored);
    let limit = f32.allocated / 2;

    let before = mlx_rs::memory::active_memory().expect("active memory");
    let options = |dtype| LoadOptions {
        dtype,
        memory_limit: Some(limit),
        ..LoadOptions::default()
    };
    let refused = DiffusionGemma::load(&dir, &options(ActivationDtype::Float32));
    let after = mlx_rs::memory::active_memory().expect("active memory");
    let Err(error @ LoadError::TooLarge(_)) = refused else {
        panic!("a float32 load over the limit was not refused");
    };
    let text = error.to_string();
    eprintln!("{text}");
    assert!(
        text.contains("float32")
            && text.contains("--dtype bfloat16")
            && text.contains("memory limit"),
        "{text}"
    );
    assert_eq!(after, before, "MLX allocated before refusing");

    // The same limit does not stop a load that converts nothing.
    let model = DiffusionGemma::load(&dir, &options(ActivationDtype::Bfloat16)).expect("bf16 load");
    let cache = model.prefill(&[2, 105, 9]).expect("prefill");
    model
        .denoise(&cache, &[vec![5; 16]], None)
        .expect("bf16 denoise");
}
