//! Every SIMD copy of the integer kernel against the portable one, bit for bit, and the choice
//! of a copy by name: the exactness rule of `quant/mod.rs` across instruction sets (the
//! products' own checks are `tests.rs`).

use super::scales::{self, Parts};
use super::tests::{activations, stream};
use super::*;
use super::{isa, weights};

/// How a test weight's biases relate to its scales.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Biases {
    /// Drawn apart from the scales (Q4_1's, Q4_K's, MLX's): stored.
    Free,
    /// `offset · scale` (Q4_0's −8, Q6_K's −32, Q8_0's −128): left implicit.
    Offset(f32),
}

/// A weight `[out, input]` whose code `(n, k)` is `code(n, k)`, with a scale per `scale_len`
/// inputs (16 through [`PackedWeight::from_rows`], two a block; 32 or more through
/// [`PackedWeight::from_codes`], groups) and random scales; `factored`: each scale (and free
/// bias) a small integer times a unit per 256 inputs, given as such (through `from_rows`, 16 or
/// 32). Checks the layout it got against what was asked for: nibbles exactly where every code is
/// at most 15, biases implicit exactly where they are an offset times the scales, scales and
/// free biases factored exactly where they were given so.
fn weight_of(
    (out, input): (usize, usize),
    scale_len: usize,
    code: impl Fn(usize, usize) -> u8,
    biases: Biases,
    factored: bool,
    seed: u64,
) -> PackedWeight {
    let mut r = stream(seed);
    let scale_len = if factored {
        scale_len.min(BLOCK)
    } else {
        scale_len
    };
    let (groups, per_row) = (out * input / scale_len, input / scale_len);
    let supers = input.div_ceil(256);
    // Per row and super-block, a unit of each; per value a small integer.
    let unit: Vec<[f32; 2]> = (0..out * supers)
        .map(|_| [0.002 * (1.0 + r().abs()), 0.01 * r()])
        .collect();
    let small: Vec<[i8; 2]> = (0..groups)
        .map(|_| [(r() * 127.0) as i8, (r() * 63.0) as i8])
        .collect();
    let unit_of = |g: usize| unit[g / per_row * supers + g % per_row * scale_len / 256];
    let scales: Vec<f32> = (0..groups)
        .map(|g| match factored {
            true => unit_of(g)[0] * f32::from(small[g][0]),
            false => 0.01 + 0.05 * r().abs(),
        })
        .collect();
    let biases_of: Vec<f32> = match biases {
        Biases::Free if factored => (0..groups)
            .map(|g| unit_of(g)[1] * f32::from(small[g][1]))
            .collect(),
        Biases::Free => (0..groups).map(|_| -0.3 * r()).collect(),
        Biases::Offset(o) => scales.iter().map(|s| o * s).collect(),
    };
    let w = if scale_len <= BLOCK {
        PackedWeight::from_rows((out, input), scale_len, |n, row| {
            for (k, c) in row.codes.iter_mut().enumerate() {
                *c = code(n, k);
            }
            let at = n * per_row..(n + 1) * per_row;
            row.scales.values.copy_from_slice(&scales[at.clone()]);
            row.biases.values.copy_from_slice(&biases_of[at.clone()]);
            if factored {
                for s in 0..supers {
                    row.scales.units[s] = unit[n * supers + s][0];
                    row.biases.units[s] = unit[n * supers + s][1];
                }
                for (p, g) in at.enumerate() {
                    row.scales.small[p] = small[g][0];
                    row.biases.small[p] = small[g][1];
                }
            }
        })
    } else {
        PackedWeight::from_codes(&code, &scales, &biases_of, (out, input), scale_len)
    }
    .expect("packs");
    let small_codes = (0..out).all(|n| (0..input).all(|k| code(n, k) <= 15));
    assert_eq!(
        w.nibbles(),
        small_codes,
        "nibbles exactly where every code is ≤ 15"
    );
    assert_eq!(w.implicit_biases(), biases != Biases::Free);
    assert_eq!(w.factored(), (factored, factored && biases == Biases::Free));
    assert_eq!(w.scale_len(), scale_len.min(BLOCK));
    w
}

/// `w` as the layout before nibbles, factors and implicit biases: a byte a code, every scale
/// and bias stored as a float (the portable copy on it is the reference each layout's products
/// are held to).
fn plain(w: &PackedWeight) -> PackedWeight {
    let panels = w.out.div_ceil(PANEL);
    let mut codes = vec![0u8; panels * PANEL * w.input];
    for panel in 0..panels {
        for r in 0..PANEL {
            for k in 0..w.input {
                let (byte, _) = weights::place(false, r, k);
                codes[panel * PANEL * w.input + byte] = w.code(panel, r, k);
            }
        }
    }
    let values = panels * w.geometry().per_panel();
    PackedWeight {
        codes,
        nibbles: false,
        scales: Parts::Floats((0..values).map(|at| w.scale(at)).collect()),
        biases: scales::Biases::Stored(Parts::Floats((0..values).map(|at| w.bias(at)).collect())),
        ..w.clone()
    }
}

fn bits_of(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

/// `x` through `isa`'s quantisation and product, checked against the portable copy's bits
/// (codes, steps, sums and every output).
fn assert_copy_matches_portable(
    isa: QuantIsa,
    x: &[f32],
    rows: usize,
    w: &PackedWeight,
    what: &str,
) {
    for precision in [Precision::Coarse, Precision::Fine] {
        let mut fast = QuantizedRows::default();
        fast.quantize_with(isa, x, rows, precision)
            .expect("quantizes");
        let mut slow = QuantizedRows::default();
        slow.quantize_with(QuantIsa::Portable, x, rows, precision)
            .expect("quantizes");
        assert_eq!(fast.tiled, slow.tiled, "{isa} {precision:?} {what}: codes");
        assert_eq!(
            bits_of(&fast.steps),
            bits_of(&slow.steps),
            "{isa} {precision:?} {what}: steps"
        );
        assert_eq!(
            bits_of(&fast.sums),
            bits_of(&slow.sums),
            "{isa} {precision:?} {what}: sums"
        );
        assert_eq!(
            bits_of(&fast.half_sums),
            bits_of(&slow.half_sums),
            "{isa} {precision:?} {what}: half sums"
        );
        let mut reference = vec![f32::NAN; rows * w.out()];
        matmul_with(QuantIsa::Portable, &slow, w, &mut reference).expect("multiplies");
        // The portable copy on the weight's layout gives the bits it gives on byte codes and
        // stored biases (so each layout's unpacking and biases are held to the one before).
        let mut on_plain = vec![f32::NAN; rows * w.out()];
        matmul_with(QuantIsa::Portable, &slow, &plain(w), &mut on_plain).expect("multiplies");
        assert_same_bits(
            &reference,
            &on_plain,
            w.out(),
            &format!("portable {precision:?} {what}, against byte codes and stored biases"),
        );
        let mut y = vec![f32::NAN; rows * w.out()];
        matmul_with(isa, &slow, w, &mut y).expect("multiplies");
        assert_same_bits(
            &y,
            &reference,
            w.out(),
            &format!("{isa} {precision:?} {what}"),
        );
        // The copy's own tile, whatever `matmul_with` routes: every panel on this thread.
        let tile = tile_fn(isa).expect("an available copy");
        let mut direct = vec![f32::NAN; rows * w.out()];
        let panels = w.out().div_ceil(PANEL);
        // SAFETY: one thread writes `direct` ([rows, out]); `tile` is a copy this CPU runs.
        unsafe { panels_product(&slow, w, 0..panels, OutPtr(direct.as_mut_ptr()), tile) };
        assert_same_bits(
            &direct,
            &reference,
            w.out(),
            &format!("{isa} {precision:?} {what}, its tile"),
        );
    }
}

/// `y` and the portable copy's `reference` (`[rows, out]`) hold the same bits.
fn assert_same_bits(y: &[f32], reference: &[f32], out: usize, what: &str) {
    if let Some(at) = (0..y.len()).find(|&i| y[i].to_bits() != reference[i].to_bits()) {
        panic!(
            "{what}: output [{}, {}] is {} where the portable copy gives {}",
            at / out,
            at % out,
            y[at],
            reference[at]
        );
    }
}

/// The biases each code range is tried with: free for every one, and an offset where a
/// ggml type has one (Q4_0's −8 for nibbles, Q6_K's −32, Q8_0's −128).
fn biases_for(code_max: u32) -> &'static [Biases] {
    match code_max {
        15 => &[Biases::Free, Biases::Offset(-8.0)],
        63 => &[Biases::Offset(-32.0)],
        128 => &[Biases::Free, Biases::Offset(-128.0)],
        _ => &[Biases::Free],
    }
}

/// Every copy against the portable one on random activations and codes of many shapes, with a
/// scale per 32 or more inputs (`halves` false: groups of 32, 64 and 128) or per 16: odd row
/// counts (partial tiles and passes), partial panels and half panels, k from one block to
/// 4,096, nibble codes (≤ 15, also the limit of AVX2's unsplit products) and byte codes just
/// either side of each copy's limits (127 and 128 for sdot's signed ones), stored and implicit
/// biases.
fn random_shapes_match(halves: bool) {
    eprintln!("copies here: {:?}", available());
    let shapes = [
        (1, 5, 32),
        (2, 16, 32),
        (3, 9, 64),
        (7, 17, 96),
        (8, 16, 128),
        (9, 40, 256),
        (19, 33, 1024),
        (13, 24, 4096),
    ];
    let seed = if halves { 200 } else { 100 };
    for &isa in available() {
        for (s, &(rows, out, input)) in shapes.iter().enumerate() {
            let x = activations(rows, input, seed + s as u64);
            let scale_len = if halves {
                16
            } else {
                [32, 64, 128][s % 3].min(input)
            };
            for code_max in [15u32, 31, 63, 64, 127, 128, 255] {
                let mut r = stream(seed + 7 * s as u64 + code_max as u64);
                let codes: Vec<u8> = (0..out * input)
                    .map(|_| ((r() * 0.5 + 0.5) * code_max as f32).round() as u8)
                    .collect();
                for &biases in biases_for(code_max) {
                    for factored in [false, true] {
                        let code = |n, k| codes[n * input + k];
                        let w =
                            weight_of((out, input), scale_len, code, biases, factored, s as u64);
                        let what = format!(
                            "{rows}x{out}x{input}/{scale_len} codes ≤ {code_max}, {biases:?}, \
                             factored {factored}"
                        );
                        assert_copy_matches_portable(isa, &x, rows, &w, &what);
                    }
                }
            }
        }
    }
}

#[test]
fn every_copy_gives_the_portable_bits_on_random_inputs_of_many_shapes() {
    random_shapes_match(false);
}

#[test]
fn every_copy_gives_the_portable_bits_on_weights_with_a_scale_per_16_inputs() {
    random_shapes_match(true);
}

/// Activations `x(m, k)` and codes `q(n, k)` of a named pattern.
type Pattern = Box<dyn Fn(usize, usize) -> f32>;
type Codes = Box<dyn Fn(usize, usize) -> u8>;

/// Every copy against the portable one on extreme pairs, a scale per 32 inputs or per 16:
/// codes 255 against activation codes ±127 (and fine codes near ±127), the pairs that saturate
/// `vpmaddubsw` (2·255·127 > 32,767) unless the codes are split, and the largest magnitudes
/// `sdot`'s offset codes meet; nibble codes at 15 and 0 (each nibble of a byte a different
/// step's); codes that differ between a block's halves (so a half's sum taken over the wrong
/// inputs shows); stored and implicit biases.
fn extremes_match(scale_len: usize) {
    let (rows, input) = (9, 256);
    let near = 126.498 / 127.0;
    let patterns: [(&str, Pattern); 5] = [
        ("all +1", Box::new(|_, _| 1.0)),
        ("all -1", Box::new(|_, _| -1.0)),
        (
            "alternating ±1",
            Box::new(|m, k| if (k + m) % 2 == 0 { 1.0 } else { -1.0 }),
        ),
        (
            "+1 then -1 by half",
            Box::new(|m, k| if (k / 16 + m) % 2 == 0 { 1.0 } else { -1.0 }),
        ),
        // A block's largest value 1 and the rest half a step off a code: coarse codes ±126,
        // fine codes at their bound.
        (
            "fine codes at their bound",
            Box::new(move |m, k| match k % BLOCK {
                0 => 1.0,
                _ if (k / 2 + m) % 2 == 0 => near,
                _ => -near,
            }),
        ),
    ];
    let weights: [(&str, Codes); 11] = [
        ("codes 255", Box::new(|_, _| 255)),
        (
            "codes 255 and 0",
            Box::new(|n, k| if (n + k / 2) % 2 == 0 { 255 } else { 0 }),
        ),
        (
            "codes 255 in half 0, 0 in half 1",
            Box::new(|n, k| if (n + k / 16) % 2 == 0 { 255 } else { 0 }),
        ),
        ("codes 128", Box::new(|_, _| 128)),
        ("codes 63", Box::new(|_, _| 63)),
        (
            "codes 63 and 0 by step",
            Box::new(|n, k| {
                if (n + k / STEP).is_multiple_of(2) {
                    63
                } else {
                    0
                }
            }),
        ),
        ("codes 31", Box::new(|_, _| 31)),
        ("codes 64", Box::new(|_, _| 64)),
        ("codes 15", Box::new(|_, _| 15)),
        (
            "codes 15 and 0 by step",
            Box::new(|n, k| {
                if (n + k / STEP).is_multiple_of(2) {
                    15
                } else {
                    0
                }
            }),
        ),
        (
            "codes 15 in half 0, 0 in half 1",
            Box::new(|n, k| if (n + k / 16) % 2 == 0 { 15 } else { 0 }),
        ),
    ];
    for &isa in available() {
        for (xname, pattern) in &patterns {
            let x: Vec<f32> = (0..rows * input)
                .map(|i| pattern(i / input, i % input))
                .collect();
            for (wname, code) in &weights {
                for out in [16, 21] {
                    for biases in [Biases::Free, Biases::Offset(-32.0)] {
                        for factored in [false, true] {
                            let w = weight_of((out, input), scale_len, code, biases, factored, 3);
                            let what = format!(
                                "{xname}, {wname} per {scale_len}, {biases:?}, factored {factored}"
                            );
                            assert_copy_matches_portable(isa, &x, rows, &w, &what);
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn every_copy_gives_the_portable_bits_on_extreme_codes() {
    extremes_match(32);
    // The portable copy itself is exact here: all codes 255 against all +1 activations (codes
    // 127) is 255·127·256 per row before the scales, which float64 checks.
    let input = 256;
    let w = weight_of((16, input), input, |_, _| 255, Biases::Free, false, 3);
    let mut q = QuantizedRows::default();
    q.quantize_with(QuantIsa::Portable, &vec![1.0; input], 1, Precision::Coarse)
        .expect("quantizes");
    let mut y = vec![0.0f32; 16];
    matmul_with(QuantIsa::Portable, &q, &w, &mut y).expect("multiplies");
    let mut fast = vec![0.0f32; 16];
    matmul_with(quant_isa(), &q, &w, &mut fast).expect("multiplies");
    assert_eq!(bits_of(&y), bits_of(&fast));
    let (s, b) = (w.scale(0) as f64, w.bias(0) as f64);
    let exact = s * 255.0 * input as f64 + b * input as f64;
    assert!(
        ((y[0] as f64) - exact).abs() < 1e-4 * exact.abs(),
        "{} against {exact}",
        y[0]
    );
}

#[test]
fn every_copy_gives_the_portable_bits_on_extreme_codes_with_a_scale_per_16_inputs() {
    extremes_match(16);
}

#[test]
fn an_isa_is_chosen_by_name_and_one_this_cpu_lacks_is_an_error() {
    let best = *available().last().expect("the portable copy at least");
    assert_eq!(isa::choose(None), Ok(best));
    assert_eq!(isa::choose(Some("")), Ok(best));
    assert_eq!(isa::choose(Some("Auto")), Ok(best));
    assert_eq!(isa::choose(Some("portable")), Ok(QuantIsa::Portable));
    for &isa in available() {
        assert_eq!(isa::choose(Some(&isa.flag().to_uppercase())), Ok(isa));
    }
    let unknown = isa::choose(Some("avx1024")).expect_err("not a copy");
    assert_eq!(unknown.problem, IsaProblem::Unknown);
    let message = unknown.to_string();
    assert!(
        message.contains("\"avx1024\"") && message.contains("i8mm"),
        "{message}"
    );
    // A copy of the other architecture is one this CPU lacks.
    let foreign = if cfg!(target_arch = "x86_64") {
        "neon"
    } else {
        "avx2"
    };
    let lacking = isa::choose(Some(foreign)).expect_err("another architecture's");
    assert_eq!(lacking.problem, IsaProblem::Lacking);
    let message = lacking.to_string();
    assert!(
        message.contains(foreign) && message.contains("cannot run"),
        "{message}"
    );
    for feature in cpu_features() {
        assert!(message.contains(feature), "{message} names {feature}");
    }
    // This process's copy is chosen once: asking for it again is fine, for another an error.
    let running = quant_isa();
    assert_eq!(configure(Some(running.flag())), Ok(running));
    if running != QuantIsa::Portable {
        assert_eq!(
            configure(Some("portable")).map_err(|e| e.problem),
            Err(IsaProblem::AlreadyChosen(running))
        );
    }
    assert!(matches!(
        matmul_with(
            if cfg!(target_arch = "x86_64") {
                QuantIsa::Neon
            } else {
                QuantIsa::Avx2
            },
            &QuantizedRows::default(),
            &weight_of((16, 32), 32, |_, _| 1, Biases::Free, false, 1),
            &mut []
        ),
        Err(QuantError::Isa(_))
    ));
}

/// The copy that runs here is the one the environment says it should be: `HUNCH_EXPECT_ISA`
/// (set by scripts/test-aarch64.sh for each emulated CPU, so a run proves its copy ran), else
/// `HUNCH_CPU_ISA`'s, else the best this CPU runs.
#[test]
fn the_expected_copy_runs_here() {
    let expected = std::env::var("HUNCH_EXPECT_ISA")
        .ok()
        .or_else(|| std::env::var(ISA_VARIABLE).ok());
    match expected {
        Some(name) => assert_eq!(quant_isa().flag(), name.trim().to_ascii_lowercase()),
        None => assert_eq!(Some(&quant_isa()), available().last()),
    }
    eprintln!(
        "integer products here: {} ({})",
        quant_isa(),
        cpu_features().join(" ")
    );
}
