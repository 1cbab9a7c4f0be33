use super::activations::quantize_block;
use super::*;

/// A deterministic pseudo-random stream (no dependency for tests).
pub(super) fn stream(seed: u64) -> impl FnMut() -> f32 {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

struct Case {
    out: usize,
    input: usize,
    group: usize,
    bits: u32,
    codes: Vec<u8>,
    scales: Vec<f32>,
    biases: Vec<f32>,
}

fn case(out: usize, input: usize, group: usize, bits: u32, seed: u64) -> Case {
    let mut r = stream(seed);
    let levels = (1u32 << bits) as f32;
    let codes = (0..out * input)
        .map(|_| ((r() * 0.5 + 0.5) * (levels - 1.0)).round() as u8)
        .collect();
    let groups = out * input / group;
    let scales = (0..groups).map(|_| 0.01 + 0.05 * r().abs()).collect();
    let biases = (0..groups).map(|_| -0.3 * r()).collect();
    Case {
        out,
        input,
        group,
        bits,
        codes,
        scales,
        biases,
    }
}

impl Case {
    fn weight(&self, n: usize, k: usize) -> f64 {
        let g = n * (self.input / self.group) + k / self.group;
        self.scales[g] as f64 * self.codes[n * self.input + k] as f64 + self.biases[g] as f64
    }

    /// MLX's packing: codes from the lowest bits of each word up.
    fn packed(&self) -> Vec<u32> {
        let per = 32 / self.bits as usize;
        self.codes
            .chunks_exact(per)
            .map(|c| {
                c.iter().enumerate().fold(0u32, |w, (i, &q)| {
                    w | (q as u32) << (i * self.bits as usize)
                })
            })
            .collect()
    }

    fn packed_weight(&self) -> PackedWeight {
        PackedWeight::from_affine(
            &self.packed(),
            &self.scales,
            &self.biases,
            (self.out, self.input),
            self.group,
            self.bits,
        )
        .expect("packs")
    }
}

pub(super) fn activations(rows: usize, input: usize, seed: u64) -> Vec<f32> {
    let mut r = stream(seed);
    // An outlier channel, as real activations have, so the block scales matter.
    (0..rows * input)
        .map(|i| if i % input == 5 { 20.0 * r() } else { r() })
        .collect()
}

fn product(x: &[f32], rows: usize, w: &PackedWeight, precision: Precision) -> Vec<f32> {
    let mut q = QuantizedRows::default();
    q.quantize(x, rows, precision).expect("quantizes");
    let mut y = vec![0.0; rows * w.out()];
    matmul(&q, w, &mut y).expect("multiplies");
    y
}

/// `x · Wᵀ` on the portable copy of the kernel, tile by tile, on this thread.
fn portable_product(x: &QuantizedRows, w: &PackedWeight) -> Vec<f32> {
    let (rows, out) = (x.rows(), w.out());
    let mut y = vec![0.0f32; rows * out];
    let ptr = OutPtr(y.as_mut_ptr());
    let mut values = scales::PanelValues::default();
    for panel in 0..out.div_ceil(PANEL) {
        let (scales, biases) = w.panel_values(panel, &mut values);
        for first_row in (0..rows).step_by(ROWS) {
            let tile = Tile {
                panel,
                first_row,
                rows: (rows - first_row).min(ROWS),
                cols: (out - panel * PANEL).min(PANEL),
                scales: scales.as_ptr(),
                biases: biases.as_ptr(),
            };
            // SAFETY: a single thread writes inside `y` ([rows, out]).
            unsafe { portable_tile(x, w, tile, ptr) };
        }
    }
    y
}

/// How far a product of the activations `row` with a weight row (`weight(k)`) may be from the
/// exact one: each activation is off by at most half a step (max |x| / 254 of its block, 256
/// times less when fine: `steps`), times |W|; and float32 sums (`magnitude`: Σ |x·W|).
fn rounding_bound(row: &[f32], steps: f64, weight: impl Fn(usize) -> f64, magnitude: f64) -> f64 {
    (0..row.len())
        .map(|k| {
            let block = &row[k / BLOCK * BLOCK..][..BLOCK];
            let largest = block.iter().fold(0.0f32, |a, v| a.max(v.abs()));
            largest as f64 / steps * weight(k).abs()
        })
        .sum::<f64>()
        + 1e-6 * magnitude
        + 1e-7
}

#[test]
fn products_agree_with_float64_within_the_activations_rounding() {
    for (precision, steps) in [(Precision::Coarse, 254.0), (Precision::Fine, 254.0 * 256.0)] {
        for (out, input, group, bits) in [(37, 64, 32, 4), (16, 128, 64, 8), (50, 256, 128, 4)] {
            let c = case(out, input, group, bits, out as u64);
            let rows = 11;
            let x = activations(rows, input, 7);
            let y = product(&x, rows, &c.packed_weight(), precision);
            let mut worst = 0.0f64;
            for m in 0..rows {
                for n in 0..out {
                    let terms = (0..input).map(|k| x[m * input + k] as f64 * c.weight(n, k));
                    let exact: f64 = terms.clone().sum();
                    let magnitude: f64 = terms.map(f64::abs).sum();
                    let row = &x[m * input..(m + 1) * input];
                    let bound = rounding_bound(row, steps, |k| c.weight(n, k), magnitude);
                    let got = y[m * out + n] as f64;
                    worst = worst.max((got - exact).abs() / bound);
                    assert!(
                        (got - exact).abs() <= bound,
                        "{precision:?} [{m}, {n}] of {out}x{input}/{group}/{bits}: {got} \
                         against {exact} (bound {bound})"
                    );
                }
            }
            eprintln!("{precision:?} {out}x{input}/{group}/{bits}: worst {worst:.2} of the bound");
        }
    }
}

#[test]
fn a_row_gets_the_same_bits_alone_in_any_tile_and_on_the_portable_copy() {
    let c = case(40, 96, 32, 4, 3);
    let w = c.packed_weight();
    let rows = 19;
    let x = activations(rows, 96, 11);
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    for precision in [Precision::Coarse, Precision::Fine] {
        let together = product(&x, rows, &w, precision);
        for m in [0, 7, 8, 18] {
            let alone = product(&x[m * 96..(m + 1) * 96], 1, &w, precision);
            assert_eq!(
                bits(&alone),
                bits(&together[m * 40..(m + 1) * 40]),
                "row {m}"
            );
        }
        // The portable copy, tile by tile, gives the same bits as whatever ran above, and
        // the portable quantisation the same codes as the vectorised one.
        let mut q = QuantizedRows::default();
        q.quantize(&x, rows, precision).expect("quantizes");
        let mut slow = QuantizedRows::default();
        slow.quantize_on(&x, rows, precision, quantize_block)
            .expect("quantizes");
        assert_eq!(slow.tiled, q.tiled, "{precision:?} codes");
        assert_eq!(bits(&slow.steps), bits(&q.steps), "{precision:?} steps");
        assert_eq!(bits(&slow.sums), bits(&q.sums), "{precision:?} sums");
        let portable = portable_product(&q, &w);
        assert_eq!(bits(&portable), bits(&together), "{precision:?}");
    }
}

#[test]
fn zero_blocks_and_bad_shapes_are_handled() {
    let c = case(16, 64, 32, 8, 5);
    let w = c.packed_weight();
    for precision in [Precision::Coarse, Precision::Fine] {
        let y = product(&[0.0; 64], 1, &w, precision);
        assert!(y.iter().all(|&v| v == 0.0));
    }
    let mut q = QuantizedRows::default();
    assert!(q.quantize(&[0.0; 48], 1, Precision::Fine).is_err());
    q.quantize(&[1.0; 32], 1, Precision::Fine)
        .expect("one block");
    assert!(matmul(&q, &w, &mut [0.0; 16]).is_err());
    assert_eq!(
        PackedWeight::from_affine(&[0; 16], &[0.0; 2], &[0.0; 2], (2, 64), 32, 3).err(),
        Some(QuantError::Bits(3))
    );
    assert!(matches!(
        PackedWeight::from_affine(&[0; 8], &[0.0; 4], &[0.0; 4], (1, 64), 16, 4),
        Err(QuantError::Group { .. })
    ));
}

#[test]
fn quantising_rows_together_split_between_threads_gives_each_row_its_own_codes() {
    // Large enough to be split between threads where there are several cores.
    let (rows, input) = (37, 4096);
    let x = activations(rows, input, 13);
    for precision in [Precision::Coarse, Precision::Fine] {
        let mut together = QuantizedRows::default();
        together.quantize(&x, rows, precision).expect("quantizes");
        let blocks = input / BLOCK;
        for m in [0, 8, 17, 36] {
            let mut alone = QuantizedRows::default();
            alone
                .quantize(&x[m * input..(m + 1) * input], 1, precision)
                .expect("quantizes");
            for k in 0..input {
                for extra in [0, STEP].iter().take(alone.slot() / STEP) {
                    assert_eq!(
                        alone.tiled[alone.at(0, k) + extra],
                        together.tiled[together.at(m, k) + extra],
                        "{precision:?} row {m} input {k}"
                    );
                }
            }
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&alone.steps),
                bits(&together.steps[m * blocks..(m + 1) * blocks])
            );
            assert_eq!(
                bits(&alone.sums),
                bits(&together.sums[m * blocks..(m + 1) * blocks])
            );
        }
    }
}

#[test]
fn more_rows_than_one_block_of_the_cache_give_each_row_its_own_bits() {
    // 300 rows of 4,096 inputs at 16 bits: 2.4 MB of codes, so the product runs in blocks of
    // rows (ROW_BLOCK_BYTES) and the panels are split between threads.
    let (rows, input) = (300, 4096);
    let c = case(40, input, 32, 4, 17);
    let w = c.packed_weight();
    let x = activations(rows, input, 19);
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    let together = product(&x, rows, &w, Precision::Fine);
    for m in [0, 127, 128, 299] {
        let alone = product(&x[m * input..(m + 1) * input], 1, &w, Precision::Fine);
        assert_eq!(
            bits(&alone),
            bits(&together[m * 40..(m + 1) * 40]),
            "row {m}"
        );
    }
}

/// A weight whose code `(n, k)` is `code(n, k)`, with random scales and biases.
fn halves_case(
    out: usize,
    input: usize,
    seed: u64,
) -> (PackedWeight, impl Fn(usize, usize) -> f64) {
    let mut r = stream(seed);
    let codes: Vec<u8> = (0..out * input)
        .map(|_| ((r() * 0.5 + 0.5) * 63.0).round() as u8)
        .collect();
    // As GGUF's: an f16-sized scale (11 bits) times an int8 one, exact in float32.
    let scales: Vec<f32> = (0..out * input / 16)
        .map(|_| ((r() * 2047.0) as i32 * (r() * 127.0) as i32) as f32 / (1 << 26) as f32)
        .collect();
    let w = PackedWeight::from_rows((out, input), 16, |n, row| {
        row.codes
            .copy_from_slice(&codes[n * input..(n + 1) * input]);
        let values = row
            .scales
            .values
            .iter_mut()
            .zip(row.biases.values.iter_mut());
        for (p, (s, b)) in values.enumerate() {
            *s = scales[n * input / 16 + p];
            *b = -32.0 * *s;
        }
    })
    .expect("packs");
    let weight = move |n: usize, k: usize| {
        let s = scales[(n * input + k) / 16] as f64;
        s * codes[n * input + k] as f64 - 32.0 * s
    };
    (w, weight)
}

#[test]
fn weights_with_a_scale_per_16_inputs_multiply_within_the_rounding_and_alike_everywhere() {
    let (out, input, rows) = (37, 128, 11);
    let (w, weight) = halves_case(out, input, 23);
    assert_eq!(w.scale_len(), 16);
    // The row read back is the weight's own values (exact here: the products are exact).
    let mut values = vec![0.0f32; input];
    for n in [0, 16, 36] {
        w.row(n, &mut values).expect("a row");
        for (k, v) in values.iter().enumerate() {
            assert_eq!(*v as f64, weight(n, k), "row {n} input {k}");
        }
    }
    let x = activations(rows, input, 29);
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    for (precision, steps) in [(Precision::Coarse, 254.0), (Precision::Fine, 254.0 * 256.0)] {
        let y = product(&x, rows, &w, precision);
        for m in 0..rows {
            for n in 0..out {
                let terms = (0..input).map(|k| x[m * input + k] as f64 * weight(n, k));
                let exact: f64 = terms.clone().sum();
                let magnitude: f64 = terms.map(f64::abs).sum();
                let row = &x[m * input..(m + 1) * input];
                let bound = rounding_bound(row, steps, |k| weight(n, k), magnitude);
                let got = y[m * out + n] as f64;
                assert!(
                    (got - exact).abs() <= bound,
                    "{precision:?} [{m}, {n}]: {got} against {exact} (bound {bound})"
                );
            }
        }
        // Alone or together, and the portable copy: the same bits.
        for m in [0, 8, 10] {
            let alone = product(&x[m * input..(m + 1) * input], 1, &w, precision);
            assert_eq!(bits(&alone), bits(&y[m * out..(m + 1) * out]), "row {m}");
        }
        let mut q = QuantizedRows::default();
        q.quantize(&x, rows, precision).expect("quantizes");
        let mut slow = QuantizedRows::default();
        slow.quantize_on(&x, rows, precision, quantize_block)
            .expect("quantizes");
        assert_eq!(
            bits(&slow.half_sums),
            bits(&q.half_sums),
            "{precision:?} half sums"
        );
        let portable = portable_product(&q, &w);
        assert_eq!(bits(&portable), bits(&y), "{precision:?} portable");
    }
    assert!(matches!(
        PackedWeight::from_rows((2, 64), 8, |_, _| {}),
        Err(QuantError::Group { .. })
    ));
}

/// A weight from rows whose code `(n, k)` is `code(n, k)` and whose scales and biases are
/// `scale(n, p)`, `bias(n, p)` (`p` the row's `p`-th part of `scale_len` inputs), with the
/// values `scale · code + bias` it stands for.
fn from_parts(
    (out, input): (usize, usize),
    scale_len: usize,
    code: impl Fn(usize, usize) -> u8,
    scale: impl Fn(usize, usize) -> f32,
    bias: impl Fn(usize, usize) -> f32,
) -> (PackedWeight, Vec<f32>) {
    let w = PackedWeight::from_rows((out, input), scale_len, |n, row| {
        for (k, c) in row.codes.iter_mut().enumerate() {
            *c = code(n, k);
        }
        for p in 0..input / scale_len {
            (row.scales.values[p], row.biases.values[p]) = (scale(n, p), bias(n, p));
        }
    })
    .expect("packs");
    let values = (0..out * input)
        .map(|i| {
            let (n, k) = (i / input, i % input);
            scale(n, k / scale_len) * f32::from(code(n, k)) + bias(n, k / scale_len)
        })
        .collect();
    (w, values)
}

/// Every row of `w` read back is `values`, bit for bit.
fn assert_rows_read_back(w: &PackedWeight, values: &[f32], what: &str) {
    let mut row = vec![f32::NAN; w.input()];
    for n in 0..w.out() {
        w.row(n, &mut row).expect("a row");
        let expected = &values[n * w.input()..(n + 1) * w.input()];
        for (k, (got, want)) in row.iter().zip(expected).enumerate() {
            assert_eq!(got.to_bits(), want.to_bits(), "{what}: row {n} input {k}");
        }
    }
}

#[test]
fn codes_are_nibbles_exactly_where_every_one_is_at_most_15() {
    let (out, input) = (37usize, 96usize);
    let padded = out.div_ceil(PANEL) * PANEL;
    let scale = |n: usize, p: usize| 0.01 * (1 + (n + p) % 7) as f32;
    let bias = |n: usize, p: usize| -0.1 * (1 + (n * 3 + p) % 5) as f32;
    let mut r = stream(41);
    let small: Vec<u8> = (0..out * input)
        .map(|_| ((r() * 0.5 + 0.5) * 15.0).round() as u8)
        .collect();
    // All at most 15: nibbles, half a byte a code (and two floats a block).
    let (w, values) = from_parts((out, input), 32, |n, k| small[n * input + k], scale, bias);
    assert!(w.nibbles() && !w.implicit_biases());
    assert_eq!(w.bytes(), padded * input / 2 + 8 * padded * input / 32);
    assert_rows_read_back(&w, &values, "nibbles");
    // One code of 16 in the last row (after 36 rows were packed as nibbles): bytes, and every
    // earlier row's codes as they were given.
    let last = |n: usize, k: usize| {
        if (n, k) == (out - 1, input - 1) {
            16
        } else {
            small[n * input + k]
        }
    };
    let (w, values) = from_parts((out, input), 32, last, scale, bias);
    assert!(!w.nibbles());
    assert_eq!(w.bytes(), padded * input + 8 * padded * input / 32);
    assert_rows_read_back(&w, &values, "bytes after nibbles");
    // The same codes as nibbles and as bytes multiply alike, both against float64.
    let x = activations(5, input, 43);
    let (nibbles, _) = from_parts((out, input), 32, |n, k| small[n * input + k], scale, bias);
    let (bytes, _) = from_parts(
        (out, input),
        32,
        |n, k| small[n * input + k] | if n == out - 1 && k == 0 { 0x30 } else { 0 },
        scale,
        bias,
    );
    assert!(nibbles.nibbles() && !bytes.nibbles());
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    for precision in [Precision::Coarse, Precision::Fine] {
        let a = product(&x, 5, &nibbles, precision);
        let b = product(&x, 5, &bytes, precision);
        // The rows whose codes are the same (all but the last) have the same bits.
        for m in 0..5 {
            assert_eq!(
                bits(&a[m * out..m * out + out - 1]),
                bits(&b[m * out..m * out + out - 1]),
                "{precision:?} row {m}"
            );
        }
    }
}

#[test]
fn biases_are_implicit_exactly_where_every_one_is_the_same_multiple_of_its_scale() {
    let (out, input) = (21usize, 64usize);
    let padded = out.div_ceil(PANEL) * PANEL;
    // Q6_K's: a scale per 16 inputs, the bias −32 times it (zero scales among them, whose
    // biases are −0).
    let scale = |n: usize, p: usize| ((n * 5 + p) % 9) as f32 * 0.003_906_25 - 0.007_812_5;
    let q6k = |n: usize, p: usize| -32.0 * scale(n, p);
    let code = |n: usize, k: usize| ((n * 7 + k * 3) % 64) as u8;
    let (w, values) = from_parts((out, input), 16, code, scale, q6k);
    assert!(w.implicit_biases() && !w.nibbles());
    assert_eq!(w.bytes(), padded * input + 4 * padded * input / 16);
    assert_rows_read_back(&w, &values, "implicit biases");
    // One bias one unit in the last place off, in the last row: every bias stored, that one
    // read back as it was given.
    let off = |n: usize, p: usize| {
        let b = q6k(n, p);
        if (n, p) == (out - 1, 3) {
            f32::from_bits(b.to_bits() + 1)
        } else {
            b
        }
    };
    let (w, values) = from_parts((out, input), 16, code, scale, off);
    assert!(!w.implicit_biases());
    assert_eq!(w.bytes(), padded * input + 8 * padded * input / 16);
    assert_rows_read_back(&w, &values, "one bias off");
    // A scale that is not finite keeps the biases stored.
    let nan = |n: usize, p: usize| if n == 2 { f32::NAN } else { scale(n, p) };
    let (w, _) = from_parts((out, input), 16, code, nan, |n, p| -32.0 * nan(n, p));
    assert!(!w.implicit_biases());
    // Every scale zero and every bias −0: implicit (−1 · 0 is −0); +0 biases likewise.
    for zero in [-0.0f32, 0.0] {
        let (w, values) = from_parts((out, input), 32, code, |_, _| 0.0, |_, _| zero);
        assert!(w.implicit_biases(), "biases {zero:?}");
        assert_rows_read_back(&w, &values, "zero scales");
    }
}

#[test]
fn scales_and_biases_are_factored_exactly_where_every_product_gives_the_value() {
    // Q4_K's form: per 256 inputs a unit (a float16's value) for the scales and one (negated)
    // for the biases, per 32 a 6-bit integer of each; 320 inputs, so the last unit covers
    // two blocks only.
    let (out, input) = (19usize, 320usize);
    let padded = out.div_ceil(PANEL) * PANEL;
    let d = |n: usize, s: usize| 0.000_976_562_5 * (1 + (n + 3 * s) % 11) as f32;
    let dmin = |n: usize, s: usize| -0.003_906_25 * (1 + (2 * n + s) % 5) as f32;
    let sc = |n: usize, p: usize| ((n * 7 + p * 5) % 64) as i8;
    let m = |n: usize, p: usize| ((n * 3 + p * 11) % 64) as i8;
    let code = |n: usize, k: usize| ((n + k) % 16) as u8;
    let make = |off: Option<(usize, usize)>| {
        PackedWeight::from_rows((out, input), 32, |n, row| {
            for (k, c) in row.codes.iter_mut().enumerate() {
                *c = code(n, k);
            }
            for s in 0..input.div_ceil(256) {
                (row.scales.units[s], row.biases.units[s]) = (d(n, s), dmin(n, s));
            }
            for p in 0..input / 32 {
                (row.scales.small[p], row.biases.small[p]) = (sc(n, p), m(n, p));
                row.scales.values[p] = d(n, p / 8) * f32::from(sc(n, p));
                row.biases.values[p] = dmin(n, p / 8) * f32::from(m(n, p));
                if off == Some((n, p)) {
                    // A value its factors do not give (one unit in the last place off).
                    row.scales.values[p] = f32::from_bits(row.scales.values[p].to_bits() + 1);
                }
            }
        })
        .expect("packs")
    };
    let values: Vec<f32> = (0..out * input)
        .map(|i| {
            let (n, k) = (i / input, i % input);
            let p = k / 32;
            let scale = d(n, p / 8) * f32::from(sc(n, p));
            scale * f32::from(code(n, k)) + dmin(n, p / 8) * f32::from(m(n, p))
        })
        .collect();
    let w = make(None);
    assert_eq!(w.factored(), (true, true));
    let units = padded * input.div_ceil(256);
    assert_eq!(
        w.bytes(),
        padded * input / 2 + 2 * (padded * input / 32 + 4 * units)
    );
    assert_rows_read_back(&w, &values, "factored");
    // The same weight from floats alone multiplies to the same bits.
    let floats = PackedWeight::from_rows((out, input), 32, |n, row| {
        for (k, c) in row.codes.iter_mut().enumerate() {
            *c = code(n, k);
        }
        for p in 0..input / 32 {
            row.scales.values[p] = d(n, p / 8) * f32::from(sc(n, p));
            row.biases.values[p] = dmin(n, p / 8) * f32::from(m(n, p));
        }
    })
    .expect("packs");
    assert_eq!(floats.factored(), (false, false));
    let x = activations(3, input, 47);
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    for precision in [Precision::Coarse, Precision::Fine] {
        assert_eq!(
            bits(&product(&x, 3, &w, precision)),
            bits(&product(&x, 3, &floats, precision)),
            "{precision:?}"
        );
    }
    // One scale its factors do not give, in the last row: the scales are kept as floats (the
    // biases still factored), and that one reads back as given.
    let w = make(Some((out - 1, 9)));
    assert_eq!(w.factored(), (false, true));
    let mut row = vec![0.0f32; input];
    w.row(out - 1, &mut row).expect("a row");
    let p = 9;
    let given = f32::from_bits((d(out - 1, p / 8) * f32::from(sc(out - 1, p))).to_bits() + 1);
    let k = p * 32 + 1;
    let want =
        given * f32::from(code(out - 1, k)) + dmin(out - 1, p / 8) * f32::from(m(out - 1, p));
    assert_eq!(row[k].to_bits(), want.to_bits());
}
