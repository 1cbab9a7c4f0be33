//! Building a [`DiffusionGemma`] from a [`MappedLayout`], which says how each logical weight is
//! stored (names of docs/checkpoint-layouts.md, "Module keys").

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use mlx_rs::{Array, Dtype};

use super::{LoadError, LoadOptions, MappedLayout};
use crate::model::diffusion_gemma::{
    attention::Attention,
    config::{AttentionKind, Config},
    layer::{Layer, LayerNorms},
    mlp::Mlp,
    moe::{Moe, Router},
    rope::Rope,
    self_conditioning::SelfConditioning,
    DiffusionGemma,
};
use crate::model::norm::RmsNorm;

fn eval_named(name: &str, arrays: &[&Array]) -> Result<(), LoadError> {
    mlx_rs::transforms::eval(arrays.iter().copied()).map_err(|source| LoadError::Mlx {
        name: name.to_owned(),
        source,
    })
}

/// Builds the model from any layout.
pub fn assemble(
    layout: &MappedLayout,
    config: Config,
    options: &LoadOptions,
) -> Result<DiffusionGemma, LoadError> {
    let dt = options.dtype.dtype();
    let c = &config;
    let h = c.hidden_size;
    let eps = c.rms_norm_eps;
    let bar = if options.progress {
        ProgressBar::with_draw_target(
            Some(c.num_layers() as u64 + 1),
            ProgressDrawTarget::stderr(),
        )
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("loading {msg} [{bar:30}] {pos}/{len} layers")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_message("DiffusionGemma");

    let norm = |name: String, dim: i32| -> Result<RmsNorm, LoadError> {
        let w = layout.tensor(&name, &[dim], dt)?;
        eval_named(&name, &[&w])?;
        Ok(RmsNorm::new(w, eps))
    };
    let base = "model.decoder";
    let embedding = layout.linear(&format!("{base}.embed_tokens"), c.vocab_size, h, dt)?;
    let sc = format!("{base}.self_conditioning");
    let self_conditioning = SelfConditioning::new(
        norm(format!("{sc}.pre_norm.weight"), h)?,
        Mlp::new(
            layout.linear(&format!("{sc}.gate_proj"), c.intermediate_size, h, dt)?,
            layout.linear(&format!("{sc}.up_proj"), c.intermediate_size, h, dt)?,
            layout.linear(&format!("{sc}.down_proj"), h, c.intermediate_size, dt)?,
        ),
        eps,
    );
    let final_norm = norm(format!("{base}.norm.weight"), h)?;
    bar.inc(1);

    let mut layers = Vec::with_capacity(c.num_layers());
    for (i, lc) in c.layers.iter().enumerate() {
        let p = format!("{base}.layers.{i}");
        let a = format!("{p}.self_attn");
        let (hd, nkv, nh) = (lc.head_dim, lc.num_kv_heads, c.num_attention_heads);
        let rope = Rope::new(
            match lc.kind {
                AttentionKind::Sliding => &c.rope_sliding,
                AttentionKind::Full => &c.rope_full,
            },
            hd,
        );
        let v_proj = if lc.k_eq_v {
            None
        } else {
            Some(layout.linear(&format!("{a}.v_proj"), nkv * hd, h, dt)?)
        };
        let attention = Attention::new(
            lc,
            nh,
            layout.linear(&format!("{a}.q_proj"), nh * hd, h, dt)?,
            layout.linear(&format!("{a}.k_proj"), nkv * hd, h, dt)?,
            v_proj,
            layout.linear(&format!("{a}.o_proj"), h, nh * hd, dt)?,
            norm(format!("{a}.q_norm.weight"), hd)?,
            norm(format!("{a}.k_norm.weight"), hd)?,
            rope,
            eps,
        );
        let mlp = Mlp::new(
            layout.linear(&format!("{p}.mlp.gate_proj"), c.intermediate_size, h, dt)?,
            layout.linear(&format!("{p}.mlp.up_proj"), c.intermediate_size, h, dt)?,
            layout.linear(&format!("{p}.mlp.down_proj"), h, c.intermediate_size, dt)?,
        );
        let router = Router::new(
            layout.linear(&format!("{p}.router.proj"), c.num_experts, h, dt)?,
            layout.tensor(&format!("{p}.router.scale"), &[h], dt)?,
            layout.tensor(
                &format!("{p}.router.per_expert_scale"),
                &[c.num_experts],
                Dtype::Float32,
            )?,
            eps,
            h,
            c.top_k_experts,
        );
        let mi = c.moe_intermediate_size;
        let moe = Moe::new(
            router,
            layout.experts(
                &format!("{p}.experts.gate_up_proj"),
                c.num_experts,
                2 * mi,
                h,
                dt,
            )?,
            layout.experts(&format!("{p}.experts.down_proj"), c.num_experts, h, mi, dt)?,
            mi,
        );
        let norms = LayerNorms {
            input_layernorm: norm(format!("{p}.input_layernorm.weight"), h)?,
            post_attention_layernorm: norm(format!("{p}.post_attention_layernorm.weight"), h)?,
            pre_feedforward_layernorm: norm(format!("{p}.pre_feedforward_layernorm.weight"), h)?,
            post_feedforward_layernorm_1: norm(
                format!("{p}.post_feedforward_layernorm_1.weight"),
                h,
            )?,
            pre_feedforward_layernorm_2: norm(
                format!("{p}.pre_feedforward_layernorm_2.weight"),
                h,
            )?,
            post_feedforward_layernorm_2: norm(
                format!("{p}.post_feedforward_layernorm_2.weight"),
                h,
            )?,
            post_feedforward_layernorm: norm(format!("{p}.post_feedforward_layernorm.weight"), h)?,
        };
        layers.push(Layer {
            attention,
            mlp,
            moe,
            norms,
            // The only text tensors where encoder and decoder differ.
            encoder_scalar: layout.tensor(
                &format!("model.encoder.language_model.layers.{i}.layer_scalar"),
                &[1],
                dt,
            )?,
            decoder_scalar: layout.tensor(&format!("{p}.layer_scalar"), &[1], dt)?,
        });
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok(DiffusionGemma::new(
        config,
        embedding,
        layout.embedding_dtype(),
        layers,
        final_norm,
        self_conditioning,
        options.dtype,
    )?)
}
