//! Checkpoint layouts recognised from what other writers put on disk: tests of
//! `checkpoint::layout` that need checkpoints written first, so they live beside the writers
//! (the checkpoint module never imports this one).

use crate::checkpoint::files::MapSource;
use crate::checkpoint::format::Layout;
use crate::checkpoint::format::{INDEX, MANIFEST};
use crate::checkpoint::layout::*;
use crate::checkpoint::tensors::{Dtype, PlannedTensor, TensorSet};
use crate::tools::quant::{self, SourceDtype};
use crate::tools::random::DenseDtype;
use crate::tools::random::{Preset, RandomSpec};
use crate::tools::writer::{convert, convert_with, write_random_checkpoint};
use serde_json::Value;
use std::path::Path;

fn random(dir: &Path, layout: Layout, sets: &[&str]) -> RandomSpec {
    let mut spec = RandomSpec::new(Preset::Tiny, layout);
    spec.seed = 3;
    for s in sets {
        spec.set(s).expect("override");
    }
    write_random_checkpoint(dir, &spec).expect("write");
    spec
}

#[test]
fn hf_round_trip_and_sharding() {
    let tmp = tempfile::tempdir().expect("tmp");
    let one = tmp.path().join("one");
    let mut spec = random(&one, Layout::Hf, &[]);
    let c = Checkpoint::open(&one).expect("open");
    assert_eq!(c.layout, Layout::Hf);
    assert_eq!(c.tensors().len(), 6 + 6 * 22 - 1 + 6);
    assert!(c.ignored.is_empty());
    assert!(
        matches!(c.weight("model.decoder.layers.0.experts.gate_up_proj"), Some(Weight::Dense(t)) if t.shape == [8, 128, 128])
    );
    assert!(c
        .module_ref("model.decoder.layers.5.self_attn.v_proj")
        .is_none());
    assert!(crate::tokenizer::Tokenizer::from_dir(&one).is_ok());

    let sharded = tmp.path().join("sharded");
    spec.max_shard_bytes = 1 << 20;
    write_random_checkpoint(&sharded, &spec).expect("write sharded");
    assert!(sharded.join("model.safetensors.index.json").is_file());
    let s = Checkpoint::open(&sharded).expect("open sharded");
    assert!(s.tensors().files().len() > 2);
    // same seed, same values, whatever the sharding
    for (name, w) in c.weights() {
        let (Weight::Dense(a), Some(Weight::Dense(b))) = (w, s.weight(name)) else {
            panic!("{name}")
        };
        assert_eq!(a.bytes, b.bytes, "{name}");
    }
}

#[test]
fn nvfp4_random_equals_converted_hf_and_dequantises_close() {
    let tmp = tempfile::tempdir().expect("tmp");
    let (hf, q, conv) = (
        tmp.path().join("hf"),
        tmp.path().join("q"),
        tmp.path().join("conv"),
    );
    random(&hf, Layout::Hf, &[]);
    random(&q, Layout::Nvfp4, &[]);
    convert(&hf, &conv, Layout::Nvfp4).expect("convert");
    let a = std::fs::read(q.join("model.safetensors")).expect("read");
    let b = std::fs::read(conv.join("model.safetensors")).expect("read");
    assert!(a == b, "random nvfp4 and convert(random hf) differ");
    let manifest = read_json(&q.join(MANIFEST)).expect("manifest");
    assert_eq!(
        manifest["weight_map"]["model.decoder.layers.0.experts.down_proj.scales"],
        "model.safetensors"
    );
    assert!(read_json(&q.join("config.json"))
        .expect("cfg")
        .get("vision_config")
        .is_none());

    let c = Checkpoint::open(&q).expect("open");
    let h = Checkpoint::open(&hf).expect("open hf");
    assert_eq!(c.layout, Layout::Nvfp4);
    let m = "model.decoder.layers.2.experts.down_proj";
    let Some(Weight::Quantized(w)) = c.weight(m) else {
        panic!("not quantised")
    };
    assert_eq!(w.mode, QuantMode::Nvfp4);
    assert_eq!(
        (w.codes.shape, w.scales.shape),
        (&[8, 128, 8][..], &[8, 128, 4][..])
    );
    let gs = w.global_scale.expect("gs").to_f32().expect("f32");
    let Some(Weight::Dense(orig)) = h.weight(m) else {
        panic!("hf")
    };
    let orig = orig.to_f32().expect("f32");
    let codes = w.codes.to_u32().expect("u32");
    let per = orig.len() / 8;
    for e in 0..8 {
        // the per-expert global scale is the expert's absmax
        let amax = orig[e * per..(e + 1) * per]
            .iter()
            .fold(0f32, |m, v| m.max(v.abs()));
        assert_eq!(gs[e], amax);
        let q = quant::Nvfp4 {
            codes: codes[e * per / 8..(e + 1) * per / 8].to_vec(),
            scales: w.scales.bytes[e * per / 16..(e + 1) * per / 16].to_vec(),
        };
        let d = quant::dequantize_nvfp4(&q, Some(gs[e]));
        let err = d
            .iter()
            .zip(&orig[e * per..])
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(
            err <= amax / 6.0 * 1.01,
            "expert {e}: max error {err}, absmax {amax}"
        );
    }
    // dense tensors are copied as bf16
    let Some(Weight::Dense(n)) = c.weight("model.decoder.layers.0.input_layernorm") else {
        panic!()
    };
    assert_eq!(n.dtype, Dtype::BF16);
}

#[test]
fn affine_layout_follows_mlx_conventions() {
    let tmp = tempfile::tempdir().expect("tmp");
    let (hf, q) = (tmp.path().join("hf"), tmp.path().join("q"));
    random(&hf, Layout::Hf, &[]);
    random(&q, Layout::Affine, &[]);
    let cfg = read_json(&q.join("config.json")).expect("cfg");
    let qc = &cfg["quantization"];
    assert_eq!(
        (
            qc["group_size"].as_u64(),
            qc["bits"].as_u64(),
            qc["mode"].as_str()
        ),
        (Some(64), Some(4), Some("affine"))
    );
    assert_eq!(qc["model.decoder.embed_tokens"]["bits"], 8);
    assert_eq!(qc["model.decoder.layers.0.router.proj"]["bits"], 8);
    assert!(
        qc.get("model.decoder.layers.0.experts.gate_up_proj")
            .is_none(),
        "experts take the default"
    );
    assert_eq!(cfg["quantization_config"], *qc);
    let c = Checkpoint::open(&q).expect("open");
    assert_eq!(c.layout, Layout::Affine);
    let h = Checkpoint::open(&hf).expect("hf");
    for (m, bits) in [
        ("model.decoder.layers.1.self_attn.q_proj", 8),
        ("model.decoder.layers.1.experts.gate_up_proj", 4),
    ] {
        let Some(Weight::Quantized(w)) = c.weight(m) else {
            panic!("{m}")
        };
        assert_eq!(
            w.mode,
            QuantMode::Affine {
                group_size: 64,
                bits
            }
        );
        assert_eq!(w.codes.name, format!("{m}.weight"));
        let Some(Weight::Dense(o)) = h.weight(m) else {
            panic!("{m}")
        };
        let o = o.to_f32().expect("f32");
        let a = quant::Affine {
            codes: w.codes.to_u32().expect("u32"),
            scales: w.scales.to_f32().expect("f32"),
            biases: w.biases.expect("biases").to_f32().expect("f32"),
            bits,
            group_size: 64,
        };
        let d = quant::dequantize_affine(&a, SourceDtype::Bf16);
        let rms = (o.iter().map(|x| x * x).sum::<f32>() / o.len() as f32).sqrt();
        let err = d
            .iter()
            .zip(&o)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(
            err < rms * if bits == 8 { 0.05 } else { 0.6 },
            "{m}: {err} vs rms {rms}"
        );
    }
}

/// Rewrites `dir`'s config.json as `edit` changes it.
fn edit_config(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = dir.join("config.json");
    let mut cfg = read_json(&path).expect("cfg");
    edit(&mut cfg);
    std::fs::write(&path, cfg.to_string()).expect("write");
}

#[test]
fn validation_names_tensor_file_and_shapes() {
    let tmp = tempfile::tempdir().expect("tmp");
    let d = tmp.path().join("q");
    random(&d, Layout::Nvfp4, &[]);
    // claim a different hidden size: the first tensor read must fail with both shapes
    edit_config(&d, |cfg| cfg["text_config"]["vocab_size"] = 4096.into());
    let e = Checkpoint::open(&d).expect_err("must fail");
    let msg = e.to_string();
    assert!(matches!(e.misfit(), LayoutError::Shape { .. }), "{msg}");
    assert!(msg.contains("closest is nvfp4"), "{msg}");
    assert!(
        msg.contains("model.decoder.embed_tokens.weight")
            && msg.contains("model.safetensors")
            && msg.contains("[4096, 128]")
            && msg.contains("[2048, 128]"),
        "{msg}"
    );
    // a tensor missing from the manifest's files
    edit_config(&d, |cfg| {
        cfg["text_config"]["vocab_size"] = 2048.into();
        cfg["text_config"]["num_hidden_layers"] = 7.into();
        cfg["text_config"]["layer_types"] =
            serde_json::json!(crate::checkpoint::dims::layer_types_for(7));
    });
    let msg = Checkpoint::open(&d).expect_err("must fail").to_string();
    assert!(
        msg.contains("model.decoder.layers.6.") && msg.contains("missing"),
        "{msg}"
    );
    assert!(Checkpoint::open(tmp.path()).is_err());
}

#[test]
fn odd_dims_stay_dense_in_affine_and_f32_is_kept() {
    let tmp = tempfile::tempdir().expect("tmp");
    let (hf, q) = (tmp.path().join("hf"), tmp.path().join("q"));
    // the reference tiny model's expert width (32) is not a multiple of 64
    random(
        &hf,
        Layout::Hf,
        &["moe_intermediate_size=32", "hidden_size=64"],
    );
    convert_with(&hf, &q, Layout::Affine, DenseDtype::F32, 1 << 30).expect("convert");
    let c = Checkpoint::open(&q).expect("open");
    assert_eq!(
        c.config["quantization"]["model.decoder.layers.0.experts.down_proj"],
        false
    );
    assert!(matches!(
        c.weight("model.decoder.layers.0.experts.down_proj"),
        Some(Weight::Dense(_))
    ));
    let Some(Weight::Quantized(g)) = c.weight("model.decoder.layers.0.experts.gate_up_proj") else {
        panic!()
    };
    assert_eq!(g.scales.dtype, Dtype::F32);
    assert_eq!(c.config["dtype"], "float32");
}

/// The transformers-written reference checkpoint (f32, with a vision tower; kept in the
/// repository under `accelerator/tests/data/tiny-hf`) converts and validates.
#[test]
fn converts_the_transformers_reference_checkpoint() {
    let src = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/tiny-hf"));
    let h = Checkpoint::open(src).expect("open reference");
    assert_eq!(h.ignored.len(), 16, "vision tensors");
    let tmp = tempfile::tempdir().expect("tmp");
    for layout in [Layout::Nvfp4, Layout::Affine] {
        let out = tmp.path().join(layout.to_string());
        convert(src, &out, layout).expect("convert");
        let c = Checkpoint::open(&out).expect("open converted");
        assert!(c.ignored.is_empty());
    }
}

#[test]
fn the_layout_comes_from_the_tensors_not_from_tags() {
    let tmp = tempfile::tempdir().expect("tmp");
    let own = tmp.path().join("own");
    random(&own, Layout::Nvfp4, &[]);
    let reference = Checkpoint::open(&own).expect("own layout");
    let same_weights = |c: &Checkpoint| {
        assert_eq!(c.layout, Layout::Nvfp4);
        for (name, w) in reference.weights() {
            let (a, b) = match (w, c.weight(name)) {
                (Weight::Dense(a), Some(Weight::Dense(b))) => (a.bytes, b.bytes),
                (Weight::Quantized(a), Some(Weight::Quantized(b))) => {
                    assert_eq!(a.scales.bytes, b.scales.bytes, "{name}");
                    (a.codes.bytes, b.codes.bytes)
                }
                _ => panic!("{name} differs in kind"),
            };
            assert!(a == b, "{name}");
        }
    };
    // A foreign manifest: unknown keys, no format tag, tensors as name→file.
    let tensors: serde_json::Map<String, Value> = reference
        .tensors()
        .names()
        .map(|n| (n.to_string(), Value::from("model.safetensors")))
        .collect();
    let foreign = serde_json::json!({"exporter": "someone else", "version": "2.1",
                                     "tensors": tensors});
    std::fs::write(own.join(MANIFEST), foreign.to_string()).expect("write");
    let c = Checkpoint::open(&own).expect("foreign manifest");
    assert_eq!(c.map_source, MapSource::Map(MANIFEST));
    same_weights(&c);
    // No manifest and no index: the shard headers alone.
    std::fs::remove_file(own.join(MANIFEST)).expect("rm");
    let c = Checkpoint::open(&own).expect("headers only");
    assert_eq!(c.map_source, MapSource::Headers);
    same_weights(&c);
    // An affine checkpoint without its index, and one whose block says nvfp4, is judged by
    // its tensors too: with a non-affine mode nothing fits, and nvfp4 is not the closest.
    let affine = tmp.path().join("affine");
    random(&affine, Layout::Affine, &[]);
    std::fs::remove_file(affine.join(INDEX)).expect("rm");
    assert_eq!(detect_layout(&affine).expect("affine"), Layout::Affine);
    edit_config(&affine, |cfg| {
        for key in ["quantization", "quantization_config"] {
            cfg[key]["mode"] = "nvfp4".into();
        }
    });
    let e = detect_layout(&affine).expect_err("an nvfp4 block is not affine");
    assert!(matches!(e, LayoutError::NoLayoutFits { .. }), "{e}");
}

#[test]
fn a_tensor_in_the_wrong_dtype_names_the_closest_layout_and_what_it_expected() {
    let tmp = tempfile::tempdir().expect("tmp");
    let d = tmp.path().join("q");
    random(&d, Layout::Nvfp4, &[]);
    // Rewrite the file with one expert's block scales as F32 instead of U8.
    let path = d.join("model.safetensors");
    let bad = "model.decoder.layers.0.experts.gate_up_proj.scales";
    let plan: Vec<PlannedTensor>;
    let data: Vec<Vec<u8>>;
    {
        let set = TensorSet::open(std::slice::from_ref(&path)).expect("open");
        let f = &set.files()[0];
        let names: Vec<String> = f.names().map(str::to_string).collect();
        plan = names
            .iter()
            .map(|n| {
                let i = f.info(n).expect("info");
                let dtype = if n == bad { Dtype::F32 } else { i.dtype };
                PlannedTensor {
                    name: n.clone(),
                    dtype,
                    shape: i.shape.clone(),
                }
            })
            .collect();
        data = names
            .iter()
            .map(|n| {
                let b = f.tensor(n).expect("t").bytes;
                if n == bad {
                    b.iter().flat_map(|&x| (x as f32).to_le_bytes()).collect()
                } else {
                    b.to_vec()
                }
            })
            .collect();
    }
    let mut w =
        crate::tools::writer::SafetensorsWriter::create(&path, plan.clone(), &Default::default())
            .expect("create");
    for (t, b) in plan.iter().zip(&data) {
        w.write(&t.name, b).expect("write");
    }
    w.finish().expect("finish");
    let msg = Checkpoint::open(&d).expect_err("must fail").to_string();
    assert!(
        msg.contains("closest is nvfp4")
            && msg.contains(bad)
            && msg.contains("dtype F32, expected U8"),
        "{msg}"
    );
}

#[test]
fn hf_quantisation_methods_are_named_when_nothing_fits() {
    let tmp = tempfile::tempdir().expect("tmp");
    let d = tmp.path().join("hf");
    random(&d, Layout::Hf, &[]);
    // The tensors are dense: a quant_method in the config does not change what they are.
    edit_config(&d, |cfg| {
        cfg["quantization_config"] = serde_json::json!({"quant_method": "modelopt"})
    });
    assert_eq!(detect_layout(&d).expect("detect"), Layout::Hf);
    // When the tensors fit nothing, the error says what the config claims.
    edit_config(&d, |cfg| cfg["text_config"]["hidden_size"] = 256.into());
    let msg = detect_layout(&d).expect_err("refused").to_string();
    assert!(msg.contains("\"modelopt\""), "{msg}");
}

#[test]
fn a_checkpoint_opened_with_its_parsed_config_never_reads_config_json_again() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("ckpt");
    random(&dir, Layout::Nvfp4, &[]);
    let config = read_json(&dir.join("config.json")).expect("config.json");
    let opened = Checkpoint::open(&dir).expect("open");
    // What the loader does: the config parsed once, the file not read again (here: gone).
    std::fs::remove_file(dir.join("config.json")).expect("remove config.json");
    let c = Checkpoint::with_config(&dir, config).expect("with its parsed config");
    assert_eq!(c.layout, opened.layout);
    assert_eq!(c.dims, opened.dims);
    assert_eq!(
        c.module_names().collect::<Vec<_>>(),
        opened.module_names().collect::<Vec<_>>()
    );
}
