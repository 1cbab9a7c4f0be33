//! Which way every product of a pass is computed on this backend: tests of `model::widened`
//! that need a checkpoint written first, so they live beside the writers (the model module
//! never imports this one). They count the products of each path as the graphs are built
//! (`widened::take_product_paths`), not how long they take.

use crate::checkpoint::format::Layout;
use crate::checkpoint::LoadOptions;
use crate::model::widened::{self, take_product_paths, ProductPaths};
use crate::model::{ActivationDtype, DiffusionGemma};
use crate::tools::random::{Preset, RandomSpec};
use crate::tools::writer::write_random_checkpoint;

/// The products of one pass through the layers: per layer the q, k, v (none on K=V layers) and
/// o projections, the attention, the dense MLP's gate, up and down, the router and the two
/// expert stacks.
fn per_layers(model: &DiffusionGemma) -> u32 {
    let per_layer = |k_eq_v: bool| if k_eq_v { 10 } else { 11 };
    model
        .config()
        .layers
        .iter()
        .map(|l| per_layer(l.k_eq_v))
        .sum()
}

/// The paths of a prefill of one chunk, a 1-canvas decoder pass, a second step with
/// self-conditioning, and a 4-canvas pass unembedding two positions, each with the total of
/// products it should have had.
fn passes(model: &DiffusionGemma) -> Vec<(&'static str, ProductPaths, u32)> {
    let layers = per_layers(model);
    let prompt: Vec<u32> = (3..40).collect();
    let canvas: Vec<u32> = (100..116).collect();
    let mut out = Vec::new();
    take_product_paths();
    let cache = model.prefill(&prompt).expect("prefill");
    out.push(("prefill", take_product_paths(), layers));
    let logits = model
        .denoise(&cache, std::slice::from_ref(&canvas), None)
        .expect("1-canvas pass");
    // + the tied head
    out.push(("1-canvas pass", take_product_paths(), layers + 1));
    model
        .denoise(&cache, std::slice::from_ref(&canvas), Some(&logits))
        .expect("self-conditioned pass");
    // + the soft embedding `p · E` and the self-conditioning MLP's three
    out.push((
        "self-conditioned pass",
        take_product_paths(),
        layers + 1 + 4,
    ));
    let four = vec![canvas.clone(); 4];
    model
        .denoise_at(&cache, &four, &[0, 5])
        .expect("slots pass");
    out.push(("4-canvas slots pass", take_product_paths(), layers + 1));
    out
}

fn load(dir: &std::path::Path, dtype: ActivationDtype) -> DiffusionGemma {
    DiffusionGemma::load(
        dir,
        &LoadOptions {
            dtype,
            ..LoadOptions::default()
        },
    )
    .expect("load")
}

/// On the CPU no product of a bfloat16 model runs in MLX's narrow kernels: activations are
/// float32 there (`ActivationDtype::compute`), so every product with a bf16 weight is widened
/// for the call, and the attention (activations only) and NVFP4 experts (their own kernel) run
/// natively in float32 — in every layout and every kind of pass. A float32 model widens
/// nothing.
#[test]
fn every_product_of_a_bf16_model_is_widened_on_the_cpu() {
    if !widened::cpu_backend().expect("device") {
        return; // on a GPU the narrow kernels are the fast path, used as stored
    }
    for layout in [Layout::Hf, Layout::Nvfp4, Layout::Affine] {
        let tmp = tempfile::tempdir().expect("tmp");
        let mut spec = RandomSpec::new(Preset::Tiny, layout);
        spec.seed = 5;
        write_random_checkpoint(tmp.path(), &spec).expect("write");

        let model = load(tmp.path(), ActivationDtype::Bfloat16);
        assert_eq!(model.dtype(), mlx_rs::Dtype::Float32, "{layout:?}");
        let layers = model.config().layers.len() as u32;
        for (pass, paths, total) in passes(&model) {
            let what = format!("{layout:?} bf16 {pass}: {paths:?}");
            assert_eq!(paths.narrow, 0, "{what}");
            assert_eq!(paths.widened + paths.float32, total, "{what}");
            // One attention per layer; NVFP4's two expert stacks per layer.
            let experts = if layout == Layout::Nvfp4 {
                2 * layers
            } else {
                0
            };
            assert_eq!(paths.float32, layers + experts, "{what}");
        }

        let model = load(tmp.path(), ActivationDtype::Float32);
        for (pass, paths, total) in passes(&model) {
            let what = format!("{layout:?} f32 {pass}: {paths:?}");
            let want = ProductPaths {
                widened: 0,
                narrow: 0,
                float32: total,
            };
            assert_eq!(paths, want, "{what}");
        }
    }
}
