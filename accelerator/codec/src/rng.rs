//! A small, fast, platform-independent random generator for checkpoint values.

/// xoshiro256++ seeded through splitmix64: fast, small, and the same on every platform.
#[derive(Debug, Clone)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    pub fn new(seed: u64) -> Self {
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        Self {
            s: [next(), next(), next(), next()],
        }
    }

    /// Generator for one tensor: the seed mixed with an FNV-1a hash of the name.
    pub fn for_tensor(seed: u64, name: &str) -> Self {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in name.bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01B3);
        }
        Self::new(seed ^ h.rotate_left(17))
    }

    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let r = s[0].wrapping_add(s[3]).rotate_left(23).wrapping_add(s[0]);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        r
    }

    /// Uniform in [0, 1) with 24 bits.
    pub fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 * (1.0 / (1u64 << 24) as f32)
    }

    /// Fill with standard normals (Box–Muller, two values per draw pair).
    pub fn fill_normal(&mut self, out: &mut [f32]) {
        let mut chunks = out.chunks_exact_mut(2);
        for pair in &mut chunks {
            let (a, b) = self.normal_pair();
            pair[0] = a;
            pair[1] = b;
        }
        if let [last] = chunks.into_remainder() {
            *last = self.normal_pair().0;
        }
    }

    /// Fill with `std` × standard normals.
    pub fn fill_normal_scaled(&mut self, out: &mut [f32], std: f32) {
        self.fill_normal(out);
        for x in out {
            *x *= std;
        }
    }

    /// Fill with `center` × (1 + `rel` × standard normal).
    pub fn fill_normal_around(&mut self, out: &mut [f32], center: f32, rel: f32) {
        self.fill_normal(out);
        for x in out {
            *x = center * (1.0 + rel * *x);
        }
    }

    /// Fill with uniform values in [`lo`, `hi`).
    pub fn fill_uniform(&mut self, out: &mut [f32], lo: f32, hi: f32) {
        for x in out {
            *x = lo + (hi - lo) * self.uniform();
        }
    }

    fn normal_pair(&mut self) -> (f32, f32) {
        let x = self.next_u64();
        // u1 in (0, 1] so ln is finite; u2 in [0, 1)
        let u1 = ((x >> 40) as f32 + 1.0) * (1.0 / (1u64 << 24) as f32);
        let u2 = ((x & 0xFF_FFFF) as f32) * (1.0 / (1u64 << 24) as f32);
        let r = (-2.0 * u1.ln()).sqrt();
        let (s, c) = (std::f32::consts::TAU * u2).sin_cos();
        (r * c, r * s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_depend_on_seed_and_name() {
        let mut a = vec![0f32; 1000];
        let mut b = vec![0f32; 1000];
        Rng::for_tensor(1, "x").fill_normal_scaled(&mut a, 2.0);
        Rng::for_tensor(1, "x").fill_normal_scaled(&mut b, 2.0);
        assert_eq!(a, b);
        Rng::for_tensor(1, "y").fill_normal_scaled(&mut b, 2.0);
        assert_ne!(a, b);
        Rng::for_tensor(1, "x").fill_uniform(&mut b, -1.0, 1.0);
        assert!(b.iter().all(|v| (-1.0..1.0).contains(v)));
    }
}
