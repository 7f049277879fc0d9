//! A seeded generator and byte mutations for the stable driver (no external crates, so a
//! run is reproducible from its seed alone).

/// SplitMix64: small, fast, and good enough to choose mutations.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }

    pub fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }

    pub fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len())]
    }
}

/// Integers that break length and offset fields.
const INTERESTING: [u32; 8] = [0, 1, 0x7f, 0xff, 0x7fff_ffff, 0x8000_0000, 0xffff_fffe, 0xffff_ffff];

/// One generic mutation of `data` (for estimator inputs and Parquet bodies alike):
/// bit flips, interesting integers, inserted/deleted/duplicated ranges, truncation.
pub fn mutate(rng: &mut Rng, data: &mut Vec<u8>) {
    if data.is_empty() {
        let n = 1 + rng.below(64);
        data.extend(rng.bytes(n));
        return;
    }
    let n = data.len();
    match rng.below(8) {
        0 | 1 => {
            for _ in 0..1 + rng.below(4) {
                let q = rng.below(n);
                data[q] ^= 1 << rng.below(8);
            }
        }
        2 => {
            let q = rng.below(n);
            data[q] = rng.next_u64() as u8;
        }
        3 if n >= 4 => {
            let q = rng.below(n - 3);
            let v = rng.pick(&INTERESTING).to_le_bytes();
            data[q..q + 4].copy_from_slice(&v);
        }
        4 => {
            let q = rng.below(n + 1);
            let n_extra = 1 + rng.below(16);
            let extra = rng.bytes(n_extra);
            data.splice(q..q, extra);
        }
        5 => {
            let q = rng.below(n);
            let len = 1 + rng.below((n - q).min(32));
            data.drain(q..q + len);
        }
        6 => {
            let q = rng.below(n);
            let len = 1 + rng.below((n - q).min(32));
            let copy = data[q..q + len].to_vec();
            let at = rng.below(data.len() + 1);
            data.splice(at..at, copy);
        }
        _ => data.truncate(rng.below(n)),
    }
}
