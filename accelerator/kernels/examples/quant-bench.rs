//! `quant-bench`: the integer products' throughput on this machine for every copy of the kernel
//! this CPU runs (AVX-512 VNNI, AVX-VNNI, AVX2; NEON, dotprod, i8mm), each against the best one
//! (AVX-512 VNNI where present) in the same run, and against the port bound of `vpdpbusd`
//! measured in the same run (a loop of independent register-only `vpdpbusd`s), so the printed
//! ratios hold whatever the clock (docs/benchmarks.md, "Integer products").
//!
//!     cargo run --release -p hunch-kernels --example quant-bench [-- --rows 128 --reps 5]
//!
//! `--portable 1` adds the portable copy (one scalar at a time: minutes). Shapes are a 1B
//! Llama's projections (2048 wide, 8192 feed-forward): q/o, gate/up, down; 4-bit codes packed as
//! a Q4_K file's are (nibbles, scales and biases factored), the down shape with 6-bit codes as
//! a Q6_K file's are (a scale per 16, biases implicit), and the q/o shape again with 8-bit
//! codes (which AVX2 splits in two; bytes, float scales and biases).

use std::time::Instant;

use hunch_kernels::quant::{self, PackedWeight, Precision, QuantIsa, QuantizedRows};

/// A deterministic stream of values in [-1, 1) (xorshift), so runs are comparable.
struct Values(u64);

impl Values {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

fn main() {
    let mut rows = 128usize;
    let mut reps = 5usize;
    let mut portable = false;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value: usize = args
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{flag} needs a number"));
        match flag.as_str() {
            "--rows" => rows = value,
            "--reps" => reps = value,
            "--portable" => portable = value != 0,
            other => panic!("unknown flag {other}"),
        }
    }
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let copies: Vec<QuantIsa> = quant::available()
        .iter()
        .rev()
        .copied()
        .filter(|&isa| portable || isa != QuantIsa::Portable)
        .collect();
    let names: Vec<&str> = copies.iter().map(|i| i.flag()).collect();
    println!(
        "machine: {}, {threads} threads; copies {} (ratios against {})",
        cpu_name(),
        names.join(", "),
        names[0]
    );
    let peak = peak_products_per_second(threads);
    println!(
        "port bound: {:.1} G vpdpbusd/s over {threads} threads ({:.0} G byte products/s)",
        peak / 1e9,
        peak * 64.0 / 1e9
    );
    let mut values = Values(0x9E37_79B9_7F4A_7C15);
    for (name, out, input, bits) in [
        ("q/o 2048x2048", 2048, 2048, 4),
        ("small 2048x256", 2048, 256, 4),
        ("gate/up 8192x2048", 8192, 2048, 4),
        ("down 2048x8192", 2048, 8192, 4),
        ("down 6-bit", 2048, 8192, 6),
        ("q/o 8-bit", 2048, 2048, 8),
    ] {
        let groups = input / 32;
        let scales: Vec<f32> = (0..out * groups)
            .map(|_| 0.01 + 0.001 * values.next())
            .collect();
        let biases: Vec<f32> = (0..out * groups)
            .map(|_| -0.08 + 0.001 * values.next())
            .collect();
        let levels = (1u32 << bits) as f32;
        let codes: Vec<u8> = (0..out * input)
            .map(|_| ((values.next() + 1.0) * levels / 2.0).min(levels - 1.0) as u8)
            .collect();
        let w = if bits == 4 {
            // As a Q4_K file packs: nibble codes, each scale and bias a 6-bit integer times a
            // unit per 256 inputs.
            k_quant_like(&codes, (out, input), &mut values)
        } else if bits == 6 {
            q6_k_like(&codes, (out, input), &mut values)
        } else {
            PackedWeight::from_codes(
                |n, k| codes[n * input + k],
                &scales,
                &biases,
                (out, input),
                32,
            )
            .expect("pack")
        };
        let x: Vec<f32> = (0..rows * input).map(|_| values.next()).collect();
        let mut y = vec![0.0f32; rows * out];
        for precision in [Precision::Fine, Precision::Coarse] {
            // The copies take turns within each repetition (best of `reps` each), so a slow
            // spell of this noisy machine falls on all of them rather than on one.
            let mut quantized: Vec<QuantizedRows> =
                copies.iter().map(|_| Default::default()).collect();
            let mut best_product = vec![f64::MAX; copies.len()];
            let mut best_quantize = vec![f64::MAX; copies.len()];
            for _ in 0..reps {
                for (c, &isa) in copies.iter().enumerate() {
                    let t = Instant::now();
                    quantized[c]
                        .quantize_with(isa, &x, rows, precision)
                        .expect("quantize");
                    best_quantize[c] = best_quantize[c].min(t.elapsed().as_secs_f64());
                    let t = Instant::now();
                    quant::matmul_with(isa, &quantized[c], &w, &mut y).expect("matmul");
                    best_product[c] = best_product[c].min(t.elapsed().as_secs_f64());
                }
            }
            for (c, &isa) in copies.iter().enumerate() {
                let macs = (rows * out * input) as f64;
                let byte_products = macs
                    * if precision == Precision::Fine {
                        2.0
                    } else {
                        1.0
                    };
                println!(
                    "{name:>18} a{:<2} {:>10}: {:6.1} GMAC/s, {:5.2}x {}'s rate, {:4.0}% of the \
                     port bound; quantising the input {:5.2} ms ({:4.1}% of the product's time)",
                    if precision == Precision::Fine { 16 } else { 8 },
                    isa.flag(),
                    macs / best_product[c] / 1e9,
                    best_product[0] / best_product[c],
                    names[0],
                    100.0 * byte_products / 64.0 / best_product[c] / peak,
                    best_quantize[c] * 1e3,
                    100.0 * best_quantize[c] / best_product[c],
                );
            }
        }
    }
}

/// A weight of these codes packed as ggml's Q4_K is: per 256 inputs a unit for the scales and
/// one for the biases, per 32 a 6-bit integer of each (the packing holds them factored).
fn k_quant_like(codes: &[u8], (out, input): (usize, usize), values: &mut Values) -> PackedWeight {
    let supers = input.div_ceil(256);
    let units: Vec<(f32, f32)> = (0..out * supers)
        .map(|_| {
            (
                0.0005 + 0.0001 * values.next(),
                -0.001 + 0.0001 * values.next(),
            )
        })
        .collect();
    let small: Vec<(i8, i8)> = (0..out * input / 32)
        .map(|_| {
            (
                32 + (values.next() * 31.0) as i8,
                32 + (values.next() * 31.0) as i8,
            )
        })
        .collect();
    PackedWeight::from_rows((out, input), 32, |n, row| {
        row.codes
            .copy_from_slice(&codes[n * input..(n + 1) * input]);
        for s in 0..supers {
            (row.scales.units[s], row.biases.units[s]) = units[n * supers + s];
        }
        for p in 0..input / 32 {
            let (sc, m) = small[n * input / 32 + p];
            let (d, dmin) = units[n * supers + p / 8];
            (row.scales.small[p], row.biases.small[p]) = (sc, m);
            (row.scales.values[p], row.biases.values[p]) = (d * f32::from(sc), dmin * f32::from(m));
        }
    })
    .expect("pack")
}

/// A weight of these codes (≤ 63) packed as ggml's Q6_K is: a scale per 16 inputs, an 8-bit
/// integer times a unit per 256, and the biases implicit (−32 times the scale).
fn q6_k_like(codes: &[u8], (out, input): (usize, usize), values: &mut Values) -> PackedWeight {
    let supers = input.div_ceil(256);
    let units: Vec<f32> = (0..out * supers)
        .map(|_| 0.0005 + 0.0001 * values.next())
        .collect();
    let small: Vec<i8> = (0..out * input / 16)
        .map(|_| (values.next() * 127.0) as i8)
        .collect();
    PackedWeight::from_rows((out, input), 16, |n, row| {
        row.codes
            .copy_from_slice(&codes[n * input..(n + 1) * input]);
        for s in 0..supers {
            row.scales.units[s] = units[n * supers + s];
        }
        for p in 0..input / 16 {
            let sc = small[n * input / 16 + p];
            let scale = units[n * supers + p / 16] * f32::from(sc);
            (row.scales.small[p], row.scales.values[p]) = (sc, scale);
            row.biases.values[p] = -32.0 * scale;
        }
    })
    .expect("pack")
}

fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_owned())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_owned())
}

/// `vpdpbusd`s per second on `threads` threads, from registers only (no loads): the
/// instruction's port bound on this machine at its current clock.
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
fn peak_products_per_second(threads: usize) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if quant::available().contains(&QuantIsa::Avx512Vnni) {
        const ROUNDS: usize = 20_000_000;
        let t = Instant::now();
        std::thread::scope(|scope| {
            for _ in 0..threads {
                // SAFETY: `available` found AVX-512 F, BW and VNNI.
                scope.spawn(|| std::hint::black_box(unsafe { register_products(ROUNDS) }));
            }
        });
        return (threads * ROUNDS * 16) as f64 / t.elapsed().as_secs_f64();
    }
    f64::NAN
}

/// # Safety
/// The CPU has AVX-512 F, BW and VNNI.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn register_products(rounds: usize) -> i32 {
    use core::arch::x86_64::*;
    let w = std::hint::black_box(_mm512_set1_epi32(0x0102_0304));
    let a = std::hint::black_box(_mm512_set1_epi32(0x0101_0101));
    let mut acc = [_mm512_setzero_si512(); 16];
    for _ in 0..rounds {
        for sum in acc.iter_mut() {
            *sum = _mm512_dpbusd_epi32(*sum, w, a);
        }
    }
    let total = acc
        .iter()
        .fold(_mm512_setzero_si512(), |s, &v| _mm512_add_epi32(s, v));
    _mm512_reduce_add_epi32(total)
}
