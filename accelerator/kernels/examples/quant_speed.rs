use hunch_kernels::quant::{matmul, PackedWeight, Precision, QuantizedRows};
use std::time::Instant;
fn main() {
    let (m, k, n) = (128usize, 2048usize, 8192usize);
    let codes: Vec<u8> = (0..n * k).map(|i| (i * 7 % 16) as u8).collect();
    let scales = vec![0.01f32; n * k / 32];
    let biases = vec![-0.08f32; n * k / 32];
    let w =
        PackedWeight::from_codes(|a, b| codes[a * k + b], &scales, &biases, (n, k), 32).unwrap();
    let x: Vec<f32> = (0..m * k)
        .map(|i| ((i * 31 % 97) as f32 - 48.0) / 50.0)
        .collect();
    for p in [Precision::Coarse, Precision::Fine] {
        let mut q = QuantizedRows::default();
        let mut y = vec![0.0f32; m * n];
        for _ in 0..3 {
            q.quantize(&x, m, p).unwrap();
            matmul(&q, &w, &mut y).unwrap();
        }
        let reps = 20;
        let t = Instant::now();
        for _ in 0..reps {
            q.quantize(&x, m, p).unwrap();
            matmul(&q, &w, &mut y).unwrap();
        }
        let s = t.elapsed().as_secs_f64() / reps as f64;
        println!(
            "{:?} {p:?} {m}x{k}x{n}: {:.2} ms, {:.1} GMAC/s",
            hunch_kernels::quant::quant_isa(),
            s * 1e3,
            (m * k * n) as f64 / s / 1e9
        );
    }
}
