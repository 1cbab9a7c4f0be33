//! Integer products of affine-quantised weights (GGUF Q4_0/Q4_1/Q8_0 as the loader maps them,
//! mlx-community's 4- and 8-bit) with activations quantised per block of 32: what a chat
//! model's projections cost on a CPU with AVX-512 VNNI, where a float32 product of widened
//! weights runs at a quarter of the rate (docs/benchmarks.md, "Integer products").
//!
//! - `weights`: [`PackedWeight`], the repacked weight and its codes (bytes or nibbles);
//! - `scales`: its scales and biases (floats, the file's factors, or implicit biases) and a
//!   panel's values as the SIMD copies read them;
//! - `activations`: [`QuantizedRows`] at a [`Precision`] (16 or 8 bits);
//! - `isa`: [`QuantIsa`], which copy of the kernel runs (detected at run time, capped by
//!   `HUNCH_CPU_ISA`);
//! - `avx512`, `avx2` (AVX2 and AVX-VNNI), `neon` (NEON, dotprod, i8mm): the kernel's copies
//!   for each CPU family, one `tile` function each with the same signature; this file: the
//!   product, its split between threads, the portable copy of the kernel (the bit reference
//!   of all the others).
//!
//! A weight `W[n, k] = s[n, g] · q[n, k] + b[n, g]` (codes `q` unsigned, up to 8 bits, groups
//! of 32, 64 or 128 inputs, or 16 for ggml's Q6_K) is repacked once into [`PackedWeight`].
//!
//! **The packed weight.** Rows in panels of 16; a panel's inputs in steps of 4, each row's 4
//! codes side by side, so that one step (16 rows × 4 codes, 64 bytes) is one `vpdpbusd`
//! operand for 16 outputs. The codes are held one of two ways, chosen from the codes
//! themselves (never from the file's type):
//!
//! - *bytes* (any code above 15: Q5_*, Q6_K, 8-bit): step after step, 64 bytes each, row `r`'s
//!   codes at bytes `4r..4r + 4`;
//! - *nibbles* (every code at most 15: Q4_0, Q4_1, Q4_K, MLX's 4-bit): half as many bytes, a
//!   pair of steps (8 inputs) in one step's 64 bytes, the first step's code in the low nibble
//!   of the byte where its byte code would be and the second step's in the high nibble. A
//!   copy loads what it loaded for one step (64 bytes on AVX-512, a half panel's 32 on AVX2 and
//!   AVX-VNNI, four registers of 16 on NEON) and gets both steps' operands with a mask (`& 15`)
//!   and a shift (`>> 4`, then `& 15`): the registers the byte layout would have loaded, with no
//!   shuffle, so the rest of each copy is the same for both layouts. A pair never straddles a
//!   part (8 inputs inside a half block of 16), so weights with two parts unpack alike.
//!
//! Scales per row and per part (32 inputs, or 16): float32 values, or (ggml's K-quants) an int8
//! per value times a float32 unit per 256 inputs as the file holds them; biases likewise, or none
//! where every bias is the same multiple of its scale (Q4_0's −8, Q5_0's −16, Q8_0's −128,
//! Q6_K's −32). Each form is kept only where its one float32 product gives every value's bits
//! (checked value by value at packing, `scales.rs`), and the products compute a panel's values
//! once per pass into float32 (`scales::PanelValues`) which every SIMD copy reads as before, so
//! their inner loops know nothing of the forms (the portable copy computes each value itself).
//! Bytes a weight, with file sizes: docs/checkpoint-layouts.md, "GGUF blocks on the native
//! path".
//!
//! Activations `x[m, k]` are quantised per row and block of 32 ([`QuantizedRows`]):
//! `x ≈ d[m, j] · c[m, k]`, `c` in −127..=127 (what llama.cpp does to activations before its
//! integer products, "Q8_0"; at 16 bits a second byte code carries the rounding error), with
//! each block's sum `d · Σ c`. Then
//!
//! `y[m, n] = Σ_j (s[n, j] · d[m, j]) · Σ_{k∈j} q[n, k] c[m, k]  +  Σ_j b[n, j] · d[m, j] Σ_{k∈j} c[m, k]`
//!
//! A weight with a scale and bias per 16 inputs (ggml's Q6_K: `parts` 2) has two terms of
//! each kind per block, one per half, in order (half 0's scale term, its bias term, then half
//! 1's), the bias terms over each half's quantised sum. Every copy multiplies both layouts with
//! its own instructions (each half's integer sums apart, then its two terms).
//!
//! The inner sums are exact 32-bit integer sums; the outer one runs over blocks in order with
//! one fused multiply-add per term, so an output's bits depend only on its row of `x` and its
//! row of `W`, never on how many rows are multiplied together or how the work is split between
//! threads (the exactness rule of docs/logit-read.md). The portable copy computes the same
//! bits, one scalar at a time: tests hold the two together.
//!
//! The only approximation is the activations' rounding (at most 1/65,024 of a block's largest
//! value at 16 bits, 1/254 at 8); docs/logit-read.md, "Kernels", says what it does to a read.

mod activations;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(test)]
mod copies_tests;
mod isa;
#[cfg(target_arch = "aarch64")]
mod neon;
mod scales;
#[cfg(test)]
mod tests;
mod weights;

pub use activations::{Precision, QuantizedRows};
pub use isa::{
    available, configure, configured, cpu_features, quant_isa, IsaError, IsaProblem, QuantIsa,
    ISA_VARIABLE,
};
use scales::PanelValues;
pub use scales::RowValues;
pub use weights::{PackedWeight, RowParts};

use std::fmt;

/// Inputs per activation block (and per scale in a packed weight).
pub const BLOCK: usize = 32;
/// Rows of a weight per panel (one 512-bit register of 32-bit sums).
pub const PANEL: usize = 16;
/// Inputs of a row side by side in a panel (one `vpdpbusd` lane).
const STEP: usize = 4;
/// Inputs of a pair of steps: nibble codes hold two steps in one step's bytes.
const PAIR: usize = 2 * STEP;
/// Activation rows per call of the inner kernel (eight sums and eight accumulators in
/// registers).
const ROWS: usize = 8;

/// Whether the integer products are worth serving a model with here (faster than float32
/// products of widened weights): any copy but the portable one.
pub fn fast() -> bool {
    quant_isa() != QuantIsa::Portable
}

/// One tile of the product: every copy has this signature and gives the portable copy's bits.
///
/// # Safety
/// The CPU has the copy's instruction set; `out` as [`panels_product`] says.
type TileFn = unsafe fn(&QuantizedRows, &PackedWeight, Tile, OutPtr);

/// The inner kernel of `isa`, or `None` where this CPU lacks it.
fn tile_fn(isa: QuantIsa) -> Option<TileFn> {
    if !available().contains(&isa) {
        return None;
    }
    // Each arm is reached only where `available` found the copy's features (checked above).
    Some(match isa {
        QuantIsa::Portable => portable_tile,
        #[cfg(target_arch = "x86_64")]
        QuantIsa::Avx512Vnni => avx512::tile,
        #[cfg(target_arch = "x86_64")]
        QuantIsa::AvxVnni => avx2::tile_vnni,
        #[cfg(target_arch = "x86_64")]
        QuantIsa::Avx2 => avx2::tile,
        #[cfg(target_arch = "aarch64")]
        QuantIsa::I8mm => neon::tile_i8mm,
        #[cfg(target_arch = "aarch64")]
        QuantIsa::Dotprod => neon::tile_dotprod,
        #[cfg(target_arch = "aarch64")]
        QuantIsa::Neon => neon::tile,
        // Not this architecture's: `available` never lists it.
        #[allow(unreachable_patterns)]
        _ => return None,
    })
}

/// The copy of [`activations::quantize_block`] that goes with `isa` (the same bits as the
/// portable one), or `None` where this CPU lacks it.
fn block_fn(isa: QuantIsa) -> Option<activations::BlockFn> {
    if !available().contains(&isa) {
        return None;
    }
    Some(match isa {
        #[cfg(target_arch = "x86_64")]
        QuantIsa::Avx512Vnni => |values, codes, fine| {
            // SAFETY: `available` found AVX-512 F and BW.
            unsafe { avx512::quantize_block(values, codes, fine) }
        },
        #[cfg(target_arch = "x86_64")]
        QuantIsa::AvxVnni | QuantIsa::Avx2 => |values, codes, fine| {
            // SAFETY: `available` found AVX2 (both copies need it).
            unsafe { avx2::quantize_block(values, codes, fine) }
        },
        #[cfg(target_arch = "aarch64")]
        QuantIsa::I8mm | QuantIsa::Dotprod | QuantIsa::Neon => |values, codes, fine| {
            // SAFETY: `available` found NEON (all three copies need it).
            unsafe { neon::quantize_block(values, codes, fine) }
        },
        _ => activations::quantize_block,
    })
}

/// Why a weight or an activation cannot be multiplied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QuantError {
    /// Codes of a width the packing does not read (4 and 8 bits are).
    Bits(u32),
    /// A group that is not a whole number of 32-input blocks, or inputs that are not a whole
    /// number of groups.
    Group { group: usize, input: usize },
    /// Slices whose lengths disagree with the shapes given.
    Shape(&'static str),
    /// A copy of the kernel this CPU cannot run.
    Isa(QuantIsa),
}

impl fmt::Display for QuantError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QuantError::Bits(bits) => write!(f, "{bits}-bit codes (4 and 8 are supported)"),
            QuantError::Group { group, input } => write!(
                f,
                "groups of {group} over {input} inputs (groups must be a multiple of {BLOCK} \
                 and divide the inputs)"
            ),
            QuantError::Shape(why) => f.write_str(why),
            QuantError::Isa(isa) => write!(
                f,
                "this CPU cannot run the {} integer products (it has: {})",
                isa.flag(),
                cpu_features().join(" ")
            ),
        }
    }
}

impl std::error::Error for QuantError {}

/// `y = x · Wᵀ`: `y` is `[x.rows(), w.out()]`, row-major. Panels are split between the
/// process's cores; every output is the same bits however they are split.
pub fn matmul(x: &QuantizedRows, w: &PackedWeight, y: &mut [f32]) -> Result<(), QuantError> {
    matmul_with(quant_isa(), x, w, y)
}

/// [`matmul`] on the copy `isa` (for tests and benchmarks: every copy gives the same bits);
/// an error where this CPU cannot run it.
pub fn matmul_with(
    isa: QuantIsa,
    x: &QuantizedRows,
    w: &PackedWeight,
    y: &mut [f32],
) -> Result<(), QuantError> {
    let tile = tile_fn(isa).ok_or(QuantError::Isa(isa))?;
    if x.input != w.input {
        return Err(QuantError::Shape(
            "activations and weight have different inputs",
        ));
    }
    if y.len() != x.rows * w.out {
        return Err(QuantError::Shape("the output is not [rows, out]"));
    }
    let panels = w.out.div_ceil(PANEL);
    let threads = crate::threads().min(panels.div_ceil(4)).max(1);
    let out = OutPtr(y.as_mut_ptr());
    let share = panels.div_ceil(threads);
    let pieces: Vec<usize> = (0..threads).map(|t| t * share).collect();
    crate::on_threads(pieces, |from| {
        let to = (from + share).min(panels);
        // SAFETY: each thread writes only the columns of its own panels, inside `y` (checked
        // above: `y` is `[rows, out]` and every panel's columns are below `out`).
        // `tile` is a copy this CPU runs (`tile_fn`).
        unsafe { panels_product(x, w, from..to, out, tile) }
    });
    Ok(())
}

/// `y`'s first value, shared by threads that write disjoint columns.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: the threads given one write disjoint elements (their own panels' columns).
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

/// Bytes of quantised activations a block of rows holds at most: each panel's pass reads the
/// block's codes again, so the block must stay in the core's cache (L2) between panels; a
/// product of more rows (a batch of chunks) runs block by block, reading its weights once per
/// block.
const ROW_BLOCK_BYTES: usize = 1 << 20;

/// The panels `range` of `w` against every row of `x`, a block of rows at a time, each tile
/// through `tile`.
///
/// # Safety
/// `out` points to `[x.rows, w.out]` values that no other thread writes in these panels'
/// columns; the CPU runs `tile`.
unsafe fn panels_product(
    x: &QuantizedRows,
    w: &PackedWeight,
    range: std::ops::Range<usize>,
    out: OutPtr,
    tile: TileFn,
) {
    let row_bytes = (x.group_bytes() / ROWS).max(1);
    let block = (ROW_BLOCK_BYTES / row_bytes / ROWS * ROWS).max(ROWS);
    let mut values = PanelValues::default();
    let mut first = 0;
    while first < x.rows {
        let last = (first + block).min(x.rows);
        for panel in range.clone() {
            let cols = (w.out - panel * PANEL).min(PANEL);
            let (scales, biases) = w.panel_values(panel, &mut values);
            let mut m = first;
            while m < last {
                let rows = (last - m).min(ROWS);
                let t = Tile {
                    panel,
                    first_row: m,
                    rows,
                    cols,
                    scales: scales.as_ptr(),
                    biases: biases.as_ptr(),
                };
                // SAFETY: the caller's contract covers `out` and `tile`; `t`'s values are the
                // panel's, alive until the next panel.
                unsafe { tile(x, w, t, out) };
                m += rows;
            }
        }
        first = last;
    }
}

/// Up to [`ROWS`] rows of `x` against one panel of `w`.
#[derive(Clone, Copy)]
struct Tile {
    panel: usize,
    first_row: usize,
    rows: usize,
    /// Columns of the panel inside `w.out`.
    cols: usize,
    /// The panel's scales and biases as float32 values, per block, per part, 16 rows
    /// ([`PanelValues`]: the SIMD copies read these, never the weight's own forms).
    scales: *const f32,
    biases: *const f32,
}

/// The bit reference of every other copy: the same integer sums (exact, so their order does not
/// matter) and the same fused multiply-adds over blocks in order, one scalar at a time.
///
/// # Safety
/// As [`panels_product`].
unsafe fn portable_tile(x: &QuantizedRows, w: &PackedWeight, t: Tile, out: OutPtr) {
    let blocks = x.input / BLOCK;
    for i in 0..t.rows {
        let m = t.first_row + i;
        let code = |k: usize| x.tiled[x.at(m, k)] as i32;
        let fine = |k: usize| x.tiled[x.at(m, k) + STEP] as i32;
        for r in 0..t.cols {
            let mut acc = 0.0f32;
            let q = |k: usize| w.code(t.panel, r, k) as i32;
            let len = BLOCK / w.parts;
            for j in 0..blocks {
                for h in 0..w.parts {
                    let inputs = j * BLOCK + h * len..j * BLOCK + (h + 1) * len;
                    let mut dot: i32 = inputs.clone().map(|k| q(k) * code(k)).sum();
                    if x.precision == Precision::Fine {
                        dot = (dot << 8) + inputs.map(|k| q(k) * fine(k)).sum::<i32>();
                    }
                    let at = ((t.panel * blocks + j) * w.parts + h) * PANEL + r;
                    let s = w.scale(at) * x.steps[m * blocks + j];
                    acc = (dot as f32).mul_add(s, acc);
                    let sum = if w.parts == 1 {
                        x.sums[m * blocks + j]
                    } else {
                        x.half_sums[(m * blocks + j) * 2 + h]
                    };
                    acc = w.bias(at).mul_add(sum, acc);
                }
            }
            // SAFETY: (m, panel·16 + r) is inside `[rows, out]`; the caller's contract.
            unsafe { *out.0.add(m * w.out + t.panel * PANEL + r) = acc };
        }
    }
}
