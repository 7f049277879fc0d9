//! Maximal runs of equal mask bytes. Turns (policy runs) are ~10²–10³ tokens and so are
//! observations, so the estimators work run by run: finding a run's end eight bytes at a
//! time, then filling or checking whole slices, instead of branching on every token.

use std::ops::Range;

#[inline(always)]
fn word(mask: &[u8], i: usize) -> u64 {
    let bytes: [u8; 8] = mask[i..i + 8].try_into().unwrap_or([0; 8]);
    u64::from_ne_bytes(bytes)
}

/// First index `>= from` whose byte differs from `mask[from]` (or `mask.len()`).
#[inline]
pub(crate) fn run_end(mask: &[u8], from: usize) -> usize {
    let v = mask[from];
    let pattern = u64::from_ne_bytes([v; 8]);
    let mut i = from + 1;
    while i + 8 <= mask.len() && word(mask, i) == pattern {
        i += 8;
    }
    while i < mask.len() && mask[i] == v {
        i += 1;
    }
    i
}

/// The runs of `mask` in order, as (range, byte).
pub(crate) fn runs(mask: &[u8]) -> impl Iterator<Item = (Range<usize>, u8)> + '_ {
    let mut at = 0;
    std::iter::from_fn(move || {
        if at >= mask.len() {
            return None;
        }
        let end = run_end(mask, at);
        let run = (at..end, mask[at]);
        at = end;
        Some(run)
    })
}

/// Bitwise OR of all bytes: > 1 iff some byte is neither 0 nor 1. Vectorises.
#[inline]
pub(crate) fn or_all(mask: &[u8]) -> u8 {
    mask.iter().fold(0u8, |acc, &m| acc | m)
}

/// Whether every value is finite. Vectorises (no early exit): integer ops only, since a
/// fold of `is_finite` stayed scalar (callgrind, ~2 instructions per value). An exponent
/// of all ones (inf, NaN) plus one exponent step carries into the sign bit; no other does.
#[inline]
pub(crate) fn all_finite(xs: &[f32]) -> bool {
    let carry = xs.iter().fold(0u32, |acc, x| acc | (x.to_bits() & 0x7f80_0000).wrapping_add(0x0080_0000));
    carry & 0x8000_0000 == 0
}

/// Whether every value is exactly zero. Vectorises (no early exit).
#[inline]
pub(crate) fn all_zero(xs: &[f32]) -> bool {
    xs.iter().fold(true, |acc, &x| acc & (x == 0.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(mask: &[u8]) -> Vec<(Range<usize>, u8)> {
        let mut out: Vec<(Range<usize>, u8)> = Vec::new();
        for (i, &m) in mask.iter().enumerate() {
            match out.last_mut() {
                Some((r, v)) if *v == m => r.end = i + 1,
                _ => out.push((i..i + 1, m)),
            }
        }
        out
    }

    #[test]
    fn all_finite_is_is_finite() {
        let specials = [
            0.0,
            -0.0,
            1.0,
            f32::MAX,
            f32::MIN,
            f32::MIN_POSITIVE,
            1e-45,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -f32::NAN,
        ];
        for &x in &specials {
            for n in [1, 7, 33] {
                let mut xs = vec![1.5f32; n];
                xs[n / 2] = x;
                assert_eq!(all_finite(&xs), x.is_finite(), "{x} in {n}");
            }
        }
        assert!(all_finite(&[]));
    }

    #[test]
    fn runs_match_a_naive_scan() {
        let mut state = 12345u64;
        for len in 0..200 {
            let mask: Vec<u8> = (0..len)
                .map(|_| {
                    state = state.wrapping_mul(6364136223846793005).wrapping_add(1);
                    // long runs: flip with probability 1/16
                    ((state >> 60) == 0) as u8
                })
                .scan(0u8, |cur, flip| {
                    *cur ^= flip;
                    Some(*cur)
                })
                .collect();
            let expect = naive(&mask);
            assert_eq!(runs(&mask).collect::<Vec<_>>(), expect);
        }
    }
}
