//! Python-compatible random draws for the read's noise.
//!
//! The reference read (djev) draws each slot's noise token with `random.Random(seed)` and
//! `randrange(vocab)`. Reproducing that bit for bit is what makes Hunch's reads comparable with
//! the reference: this is CPython's MT19937, its `init_by_array` seeding from an integer, and its
//! `_randbelow_with_getrandbits` rejection loop.

const N: usize = 624;
const M: usize = 397;
const MATRIX_A: u32 = 0x9908_b0df;
const UPPER_MASK: u32 = 0x8000_0000;
const LOWER_MASK: u32 = 0x7fff_ffff;

/// CPython's `random.Random`, as far as the read needs it.
pub struct PythonRandom {
    state: [u32; N],
    index: usize,
}

impl PythonRandom {
    /// `random.Random(seed)` for a non-negative integer seed: the seed's 32-bit little-endian
    /// words feed `init_by_array` (an empty key becomes `[0]`, as in CPython).
    pub fn new(seed: u64) -> Self {
        let mut key = vec![seed as u32];
        if seed >> 32 != 0 {
            key.push((seed >> 32) as u32);
        }
        let mut rng = PythonRandom {
            state: [0; N],
            index: N,
        };
        rng.init_by_array(&key);
        rng
    }

    fn init_genrand(&mut self, seed: u32) {
        self.state[0] = seed;
        for i in 1..N {
            let prev = self.state[i - 1];
            self.state[i] = 1_812_433_253u32
                .wrapping_mul(prev ^ (prev >> 30))
                .wrapping_add(i as u32);
        }
        self.index = N;
    }

    fn init_by_array(&mut self, key: &[u32]) {
        self.init_genrand(19_650_218);
        let mt = &mut self.state;
        let (mut i, mut j) = (1usize, 0usize);
        for _ in 0..N.max(key.len()) {
            let prev = mt[i - 1];
            mt[i] = (mt[i] ^ (prev ^ (prev >> 30)).wrapping_mul(1_664_525))
                .wrapping_add(key[j])
                .wrapping_add(j as u32);
            i += 1;
            j += 1;
            if i >= N {
                mt[0] = mt[N - 1];
                i = 1;
            }
            if j >= key.len() {
                j = 0;
            }
        }
        for _ in 0..N - 1 {
            let prev = mt[i - 1];
            mt[i] =
                (mt[i] ^ (prev ^ (prev >> 30)).wrapping_mul(1_566_083_941)).wrapping_sub(i as u32);
            i += 1;
            if i >= N {
                mt[0] = mt[N - 1];
                i = 1;
            }
        }
        mt[0] = 0x8000_0000;
        self.index = N;
    }

    fn generate(&mut self) {
        let mt = &mut self.state;
        for k in 0..N {
            let y = (mt[k] & UPPER_MASK) | (mt[(k + 1) % N] & LOWER_MASK);
            let mag = if y & 1 == 1 { MATRIX_A } else { 0 };
            mt[k] = mt[(k + M) % N] ^ (y >> 1) ^ mag;
        }
        self.index = 0;
    }

    /// One raw 32-bit output (`getrandbits(32)`).
    pub fn next_u32(&mut self) -> u32 {
        if self.index >= N {
            self.generate();
        }
        let mut y = self.state[self.index];
        self.index += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^= y >> 18;
        y
    }

    /// `getrandbits(k)` for `1 <= k <= 32`.
    fn getrandbits(&mut self, k: u32) -> u32 {
        self.next_u32() >> (32 - k)
    }

    /// `randrange(n)` for `1 <= n <= 2^32`: CPython draws `n.bit_length()` bits and rejects
    /// values `>= n`.
    pub fn randrange(&mut self, n: u32) -> u32 {
        if n <= 1 {
            return 0;
        }
        let k = 32 - n.leading_zeros();
        loop {
            let r = self.getrandbits(k);
            if r < n {
                return r;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn first(seed: u64, n: u32, count: usize) -> Vec<u32> {
        let mut rng = PythonRandom::new(seed);
        (0..count).map(|_| rng.randrange(n)).collect()
    }

    #[test]
    fn raw_outputs_match_cpython() {
        let mut rng = PythonRandom::new(42);
        assert_eq!(rng.next_u32(), 2_746_317_213);
        assert_eq!(rng.next_u32(), 478_163_327);
    }

    #[test]
    fn randrange_matches_the_brief_vectors() {
        let vocab = 262_144;
        assert_eq!(
            first(42, vocab, 6),
            [58369, 13112, 144194, 128393, 117026, 73158]
        );
        assert_eq!(
            first(43, vocab, 6),
            [20212, 149990, 75462, 242500, 193922, 50480]
        );
        assert_eq!(
            first(43 + 7919, vocab, 6),
            [65753, 69809, 93876, 34419, 221914, 76255]
        );
        assert_eq!(
            first(42 + 104_729, vocab, 6),
            [220972, 162782, 122139, 118925, 26310, 50396]
        );
    }

    #[test]
    fn small_ranges_large_seeds_and_zero_match_cpython() {
        // Vectors printed by CPython 3.11: `[random.Random(s).randrange(n) for ...]`.
        assert_eq!(first(0, 512, 5), [394, 430, 41, 265, 497]);
        assert_eq!(first((1 << 40) + 5, 1000, 5), [516, 529, 275, 679, 948]);
        assert_eq!(first(42, 512, 5), [114, 25, 281, 250, 228]);
        assert_eq!(first(7, 3, 5), [1, 0, 1, 2, 0]);
    }
}
