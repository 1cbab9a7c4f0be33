//! The quantised layouts load through MLX's quantized kernels and compute what their
//! dequantised weights compute.
//!
//! The tiny reference checkpoint (`tests/data/tiny-hf`) is converted by the project's own
//! converter to NVFP4 and to MLX affine. Then:
//! - MLX's dequantisation of the loaded codes/scales equals `tools::quant`'s, bit for bit;
//! - the quantised model (codes consumed by `gather_qmm` / `quantized_matmul`) matches the same
//!   model run dense on its dequantised weights (an HF checkpoint written from them) to 1e-3 in
//!   float32, on the encoder hidden state and the first-step denoiser logits of the golden
//!   canvases;
//! - a missing or mis-shaped tensor is an error naming the tensor and the expected shape.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use hunch_accelerator::{
    checkpoint::{
        mapped::{LoadedWeight, MappedLayout},
        tensors::{Dtype as FileDtype, PlannedTensor, SafetensorsFile},
        Checkpoint, Layout, LoadError, QuantMode, Quantized, QuantizedWeight, Weight,
    },
    model::diffusion_gemma::experts::dequantize_nvfp4,
    tools::{
        convert,
        quant::{self, SourceDtype},
        writer::{convert_with, f32_bytes, SafetensorsWriter},
        DenseDtype,
    },
    ActivationDtype, Array, DiffusionGemma, LoadOptions,
};
use mlx_rs::{ops, Dtype};

mod golden;
use golden::{data_dir, read_npy, Npy};

type TestResult = Result<(), Box<dyn std::error::Error>>;
type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// The tolerance of the brief; never loosened to make a test pass.
const TOL: f32 = 1e-3;

fn f32_vec(a: &Array) -> Res<Vec<f32>> {
    let a = a.as_dtype(Dtype::Float32)?;
    a.eval()?;
    Ok(a.as_slice::<f32>().to_vec())
}

fn max_abs(a: &Array, b: &Array) -> Res<f32> {
    if a.shape() != b.shape() {
        return Err(format!("shapes {:?} vs {:?}", a.shape(), b.shape()).into());
    }
    Ok(f32_vec(a)?
        .iter()
        .zip(&f32_vec(b)?)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max))
}

fn max_abs_npy(a: &Array, want: &Npy) -> Res<f32> {
    Ok(f32_vec(a)?
        .iter()
        .zip(&want.f32s()?)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max))
}

fn options() -> LoadOptions {
    LoadOptions {
        dtype: ActivationDtype::Float32,
        progress: false,
        ..LoadOptions::default()
    }
}

/// The model's effective weights of one quantised module, from `tools::quant` (pure Rust).
///
/// Affine: MLX's quantized kernels evaluate `scale · q + bias` in the promoted dtype of
/// activations and scales, and the loader widens the stored bf16 scales to float32 for float32
/// runs, so the float32 model multiplies with `scale · q + bias` rounded in float32 — the
/// `SourceDtype::F32` dequantisation of the same (exactly widened) scales and biases.
/// NVFP4: `e2m1 · e4m3 · global_scale / 2688`.
fn dequantised(name: &str, w: &Weight<'_>, affine_src: SourceDtype) -> Res<Vec<f32>> {
    match w {
        Weight::Dense(v) => Ok(v.to_f32()?),
        Weight::Quantized(q) => match q.mode {
            QuantMode::Affine { group_size, bits } => {
                dequantised_affine(q, group_size, bits, affine_src)
            }
            QuantMode::Nvfp4 => {
                let gs = q.global_scale.ok_or("no global scale")?.to_f32()?;
                let codes = q.codes.to_u32()?;
                let experts = gs.len();
                let (cw, sw) = (codes.len() / experts, q.scales.bytes.len() / experts);
                let mut out = Vec::with_capacity(codes.len() * 8);
                for (e, g) in gs.iter().enumerate() {
                    let block = quant::Nvfp4 {
                        codes: codes[e * cw..(e + 1) * cw].to_vec(),
                        scales: q.scales.bytes[e * sw..(e + 1) * sw].to_vec(),
                    };
                    out.extend(quant::dequantize_nvfp4(&block, Some(*g)));
                }
                if out.is_empty() {
                    return Err(format!("{name}: empty").into());
                }
                Ok(out)
            }
        },
    }
}

/// Writes a dense float32 HF checkpoint of the dequantised weights of `quantised` into `out`
/// (with the original HF config.json, so it loads as HF).
fn write_dequantised_hf(quantised: &Path, out: &Path, affine_src: SourceDtype) -> Res<()> {
    std::fs::create_dir_all(out)?;
    let c = Checkpoint::open(quantised)?;
    let mut plan = Vec::new();
    let mut data = Vec::new();
    for spec in c.dims.tensors() {
        let w = c
            .weight(spec.module())
            .ok_or_else(|| format!("{} missing", spec.module()))?;
        let values = dequantised(&spec.name, &w, affine_src)?;
        if values.len() != spec.numel() {
            return Err(format!("{}: {} values", spec.name, values.len()).into());
        }
        plan.push(PlannedTensor {
            name: spec.name.clone(),
            dtype: FileDtype::F32,
            shape: spec.shape.clone(),
        });
        data.push((spec.name.clone(), f32_bytes(&values)));
    }
    let mut w = SafetensorsWriter::create(out.join("model.safetensors"), plan, &BTreeMap::new())?;
    for (name, bytes) in &data {
        w.write(name, bytes)?;
    }
    w.finish()?;
    std::fs::copy(data_dir().join("config.json"), out.join("config.json"))?;
    Ok(())
}

fn converted(tmp: &Path, layout: Layout) -> Res<PathBuf> {
    let dir = tmp.join(layout.to_string());
    convert(&data_dir(), &dir, layout)?;
    Ok(dir)
}

/// `quant.rs`'s dequantisation of the affine weight `q`, in `src` arithmetic.
fn dequantised_affine(
    q: &QuantizedWeight<'_>,
    group_size: usize,
    bits: u32,
    src: SourceDtype,
) -> Res<Vec<f32>> {
    let a = quant::Affine {
        codes: q.codes.to_u32()?,
        scales: q.scales.to_f32()?,
        biases: q.biases.ok_or("no biases")?.to_f32()?,
        bits,
        group_size,
    };
    Ok(quant::dequantize_affine(&a, src))
}

/// MLX's dequantisation of the arrays the loader builds equals `quant.rs`'s, bit for bit.
fn check_dequantisation_bit_exact(dir: &Path) -> Res<usize> {
    let c = Checkpoint::open(dir)?;
    let layout = MappedLayout::open(dir)?;
    let mut checked = 0;
    for spec in c.dims.tensors() {
        let Some(Weight::Quantized(q)) = c.weight(spec.module()) else {
            continue;
        };
        let logical: Vec<i32> = spec.shape.iter().map(|&d| d as i32).collect();
        let LoadedWeight::Quantized(Quantized {
            codes,
            scales,
            biases,
            global_scale,
            mode,
        }) = layout.weight(spec.module(), &logical)?
        else {
            return Err(format!("{}: loaded dense", spec.name).into());
        };
        let same_bits = |mlx: &[f32], rust: &[f32], what: &str| -> Res<()> {
            if mlx.len() != rust.len() {
                return Err(format!("{}: {what}: lengths differ", spec.name).into());
            }
            if let Some(i) = (0..mlx.len()).find(|&i| mlx[i].to_bits() != rust[i].to_bits()) {
                return Err(format!(
                    "{}: {what}: element {i}: MLX {} vs quant.rs {}",
                    spec.name, mlx[i], rust[i]
                )
                .into());
            }
            Ok(())
        };
        match mode {
            QuantMode::Affine { group_size, bits } => {
                let biases = biases.ok_or("no biases")?;
                let rust = |src| dequantised_affine(&q, group_size, bits, src);
                let (g, b) = (group_size as i32, bits as i32);
                // As stored (bf16 arithmetic) …
                let mlx = ops::dequantize(&codes, &scales, &biases, g, b)?;
                if mlx.dtype() != Dtype::Bfloat16 {
                    return Err(format!("{}: stored scales not bf16", spec.name).into());
                }
                same_bits(&f32_vec(&mlx)?, &rust(SourceDtype::Bf16)?, "bf16")?;
                // … and with the scales widened to float32, as the float32 model holds them.
                let (s32, b32) = (
                    scales.as_dtype(Dtype::Float32)?,
                    biases.as_dtype(Dtype::Float32)?,
                );
                let mlx = ops::dequantize(&codes, &s32, &b32, g, b)?;
                same_bits(&f32_vec(&mlx)?, &rust(SourceDtype::F32)?, "f32")?;
            }
            QuantMode::Nvfp4 => {
                let gs = f32_vec(&global_scale.ok_or("no global scale")?)?;
                let mut mlx = Vec::new();
                for (e, g) in gs.iter().enumerate() {
                    let pick = Array::from_int(e as i32);
                    let d = dequantize_nvfp4(
                        &codes.take_axis(&pick, 0)?,
                        &scales.take_axis(&pick, 0)?,
                        *g,
                    )?;
                    mlx.extend(f32_vec(&d)?);
                }
                same_bits(
                    &mlx,
                    &dequantised(&spec.name, &Weight::Quantized(q), SourceDtype::F32)?,
                    "nvfp4",
                )?;
            }
        }
        checked += 1;
    }
    Ok(checked)
}

#[test]
fn nvfp4_dequantisation_is_bit_exact() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = converted(tmp.path(), Layout::Nvfp4)?;
    let n = check_dequantisation_bit_exact(&dir)?;
    eprintln!("nvfp4: {n} quantised modules dequantise bit-exactly");
    // gate_up and down of each of the 6 layers.
    assert_eq!(n, 12);
    Ok(())
}

#[test]
fn affine_dequantisation_is_bit_exact() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = converted(tmp.path(), Layout::Affine)?;
    let n = check_dequantisation_bit_exact(&dir)?;
    eprintln!("affine: {n} quantised modules dequantise bit-exactly");
    assert!(n > 30, "only {n} affine modules");
    Ok(())
}

/// Quantised model vs the dense model of its dequantised weights; returns the max diffs.
fn parity(layout: Layout) -> Res<()> {
    let tmp = tempfile::tempdir()?;
    let q = converted(tmp.path(), layout)?;
    let d = tmp.path().join("dequantised-hf");
    write_dequantised_hf(&q, &d, SourceDtype::F32)?;
    let quantised = DiffusionGemma::load(&q, &options())?;
    let dense = DiffusionGemma::load(&d, &options())?;
    let prompt = read_npy("prompt_ids.npy")?.ids()?;
    let canvases = read_npy("canvas_ids.npy")?.rows()?;

    let hq = quantised.encoder_hidden(&prompt)?;
    let hd = dense.encoder_hidden(&prompt)?;
    let dh = max_abs(&hq, &hd)?;

    let cq = quantised.prefill(&prompt)?;
    let cd = dense.prefill(&prompt)?;
    let lq = quantised.denoise(&cq, &canvases, None)?;
    let ld = dense.denoise(&cd, &canvases, None)?;
    let dl = max_abs(&lq, &ld)?;

    // Self-conditioning goes through the tied embedding transposed (quantized_matmul with
    // transpose = false for the affine layout).
    let sc = read_npy("sc_logits_in.npy")?;
    let sc_shape: Vec<i32> = sc.shape.iter().map(|&x| x as i32).collect();
    let sc = Array::from_slice(&sc.f32s()?, &sc_shape);
    let sq = quantised.denoise(&cq, &canvases[..1], Some(&sc))?;
    let sd = dense.denoise(&cd, &canvases[..1], Some(&sc))?;
    let ds = max_abs(&sq, &sd)?;

    // For information only: how far quantisation moved the model from transformers' outputs.
    let gh = max_abs_npy(&hq, &read_npy("encoder_last_hidden.npy")?)?;
    let gl = max_abs_npy(&lq, &read_npy("denoiser_logits.npy")?)?;
    eprintln!(
        "{layout}: quantised vs dequantised-dense: encoder hidden {dh:e}, first-step logits \
         {dl:e}, self-conditioned logits {ds:e} (vs unquantised golden: hidden {gh:e}, logits \
         {gl:e})"
    );
    assert!(dh <= TOL, "{layout}: encoder hidden differs by {dh}");
    assert!(dl <= TOL, "{layout}: first-step logits differ by {dl}");
    assert!(
        ds <= TOL,
        "{layout}: self-conditioned logits differ by {ds}"
    );
    // A real difference from the unquantised model shows the quantised weights were used.
    assert!(gl > TOL, "{layout}: logits equal the unquantised model's");
    if layout == Layout::Affine {
        // The comparison can tell weights apart that differ only by the bf16 rounding of
        // `scale · q + bias`: the bf16 dequantisation is not what the float32 model computes.
        let d16 = tmp.path().join("dequantised-bf16-hf");
        write_dequantised_hf(&q, &d16, SourceDtype::Bf16)?;
        let dense16 = DiffusionGemma::load(&d16, &options())?;
        let c16 = dense16.prefill(&prompt)?;
        let d = max_abs(&lq, &dense16.denoise(&c16, &canvases, None)?)?;
        eprintln!("{layout}: vs the bf16-rounded dequantisation instead: logits {d:e}");
        assert!(d > 0.0, "bf16 and f32 dequantisations indistinguishable");
    }
    Ok(())
}

#[test]
fn nvfp4_model_matches_its_dequantised_weights() -> TestResult {
    parity(Layout::Nvfp4)
}

#[test]
fn affine_model_matches_its_dequantised_weights() -> TestResult {
    parity(Layout::Affine)
}

/// Given a tensor's name, dtype, shape and bytes: `None` drops it, `Some` replaces its shape and
/// bytes.
type Edit<'a> = &'a dyn Fn(&str, FileDtype, &[usize], &[u8]) -> Option<(Vec<usize>, Vec<u8>)>;

/// Rewrites every safetensors file of `dir` through `edit`.
fn rewrite(dir: &Path, edit: Edit<'_>) -> Res<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().and_then(|e| e.to_str()) != Some("safetensors") {
            continue;
        }
        let mut tensors = Vec::new();
        {
            let f = SafetensorsFile::open(&path)?;
            let names: Vec<String> = f.names().map(str::to_string).collect();
            for n in names {
                let t = f.tensor(&n)?;
                if let Some((shape, bytes)) = edit(&n, t.dtype, t.shape, t.bytes) {
                    tensors.push((
                        PlannedTensor {
                            name: n.clone(),
                            dtype: t.dtype,
                            shape,
                        },
                        bytes,
                    ));
                }
            }
        }
        let plan = tensors.iter().map(|(p, _)| p.clone()).collect();
        let mut w = SafetensorsWriter::create(&path, plan, &BTreeMap::new())?;
        for (p, bytes) in &tensors {
            w.write(&p.name, bytes)?;
        }
        w.finish()?;
    }
    Ok(())
}

fn load_error(dir: &Path) -> Res<String> {
    match DiffusionGemma::load(dir, &options()) {
        Ok(_) => Err(format!("{} loaded", dir.display()).into()),
        Err(e @ LoadError::Layout(_)) => Ok(e.to_string()),
        Err(e) => Err(format!("unexpected error kind: {e}").into()),
    }
}

fn check_errors(
    layout: Layout,
    missing: (&str, &str),
    misshaped: (&str, Vec<usize>, &str),
) -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = converted(tmp.path(), layout)?;
    // Missing.
    let (name, expected) = missing;
    rewrite(&dir, &|n, _, s, b| {
        (n != name).then(|| (s.to_vec(), b.to_vec()))
    })?;
    let msg = load_error(&dir)?;
    eprintln!("{layout} missing: {msg}");
    assert!(
        msg.contains(name) && msg.contains(expected) && msg.contains("missing"),
        "{msg}"
    );

    // Mis-shaped: the tensor keeps its dtype, with a wrong leading dimension.
    let dir = converted(&tmp.path().join("again"), layout)?;
    let (name, shape, expected) = misshaped;
    rewrite(&dir, &|n, dtype, s, b| {
        if n != name {
            return Some((s.to_vec(), b.to_vec()));
        }
        let len = shape.iter().product::<usize>() * dtype.size();
        Some((shape.clone(), b[..len.min(b.len())].to_vec()))
    })?;
    let msg = load_error(&dir)?;
    eprintln!("{layout} mis-shaped: {msg}");
    let found = format!("{shape:?}");
    assert!(
        msg.contains(name) && msg.contains(expected) && msg.contains(&found),
        "{msg}"
    );
    Ok(())
}

#[test]
fn nvfp4_missing_or_misshaped_tensor_is_named_with_its_shape() -> TestResult {
    check_errors(
        Layout::Nvfp4,
        (
            "model.decoder.layers.1.experts.down_proj.scales",
            "[8, 64, 2]",
        ),
        (
            "model.decoder.layers.2.experts.gate_up_proj.weight",
            vec![4, 64, 8],
            "[8, 64, 8]",
        ),
    )
}

#[test]
fn affine_missing_or_misshaped_tensor_is_named_with_its_shape() -> TestResult {
    check_errors(
        Layout::Affine,
        ("model.decoder.layers.0.self_attn.q_proj.biases", "[64, 1]"),
        (
            "model.decoder.embed_tokens.scales",
            vec![256, 1],
            "[512, 1]",
        ),
    )
}

/// Sharded quantised checkpoints load to the same model as single-file ones, and both layouts
/// also load and run with bfloat16 activations (scales kept in their stored bf16).
#[test]
fn sharded_and_bf16_quantised_checkpoints_load() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let prompt = read_npy("prompt_ids.npy")?.ids()?;
    let canvases = read_npy("canvas_ids.npy")?.rows()?;
    let logits = |dir: &Path, dtype: ActivationDtype| -> Res<Array> {
        let m = DiffusionGemma::load(
            dir,
            &LoadOptions {
                dtype,
                progress: false,
                ..LoadOptions::default()
            },
        )?;
        let c = m.prefill(&prompt)?;
        Ok(m.denoise(&c, &canvases, None)?)
    };
    for layout in [Layout::Nvfp4, Layout::Affine] {
        let one = converted(tmp.path(), layout)?;
        let sharded = tmp.path().join(format!("{layout}-sharded"));
        convert_with(&data_dir(), &sharded, layout, DenseDtype::Bf16, 64 << 10)?;
        let shards = Checkpoint::open(&sharded)?.tensors().files().len();
        assert!(shards > 2, "{layout}: only {shards} shards");
        let d = max_abs(
            &logits(&one, ActivationDtype::Float32)?,
            &logits(&sharded, ActivationDtype::Float32)?,
        )?;
        assert_eq!(d, 0.0, "{layout}: sharded differs by {d}");
        let l16 = f32_vec(&logits(&one, ActivationDtype::Bfloat16)?)?;
        assert!(l16.iter().all(|x| x.is_finite()), "{layout}: bf16 logits");
        eprintln!("{layout}: {shards} shards load identically; bf16 activations run");
    }
    Ok(())
}
