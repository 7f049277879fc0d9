//! Results are bitwise identical whatever the number of threads: each trajectory is computed
//! by one thread in a fixed order (docs/estimators.md, "Threads, fork, the GIL").

// Helpers outside #[test] functions may unwrap too: a failed set-up fails the test.
#![allow(clippy::unwrap_used)]

use mpo_core::{
    bilevel_advantages, gae_advantages, mae_advantages, segment_turns, BiLevelParams, GaeParams, MaeParams, Rewards,
};

/// A reproducible multi-turn batch from a tiny LCG (no dev-dependency needed).
fn batch(n_traj: usize) -> (Vec<f32>, Vec<u8>, Vec<i64>, Vec<f32>) {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move |m: u64| {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (state >> 33) % m
    };
    let (mut mask, mut offsets) = (Vec::new(), vec![0i64]);
    for _ in 0..n_traj {
        for _ in 0..1 + next(6) {
            mask.extend(std::iter::repeat_n(0u8, next(20) as usize));
            mask.extend(std::iter::repeat_n(1u8, 1 + next(30) as usize));
        }
        offsets.push(mask.len() as i64);
    }
    let values = (0..mask.len()).map(|_| next(1000) as f32 / 500.0 - 1.0).collect();
    let scores = (0..n_traj).map(|_| next(2) as f32).collect();
    (values, mask, offsets, scores)
}

fn in_pool<T: Send>(threads: usize, f: impl FnOnce() -> T + Send) -> T {
    rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap().install(f)
}

#[test]
fn estimators_are_bitwise_identical_for_1_2_and_7_threads() {
    let (values, mask, offsets, scores) = batch(3000);
    let run = || {
        let mae = mae_advantages(&values, &mask, &offsets, Rewards::Score(&scores), &MaeParams::default()).unwrap();
        let gae = gae_advantages(&values, &mask, &offsets, Rewards::Score(&scores), &GaeParams::default()).unwrap();
        let turns = segment_turns(&mask, &offsets).unwrap();
        let bi = BiLevelParams { lam: 0.9, gamma: 0.99, high_level_gamma: 0.95 };
        let bilevel = bilevel_advantages(&values, &mask, &offsets, Rewards::Score(&scores), &bi).unwrap();
        (mae, gae, turns, bilevel)
    };
    let one = in_pool(1, run);
    for threads in [2, 7] {
        let other = in_pool(threads, run);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&one.0.advantages), bits(&other.0.advantages));
        assert_eq!(bits(&one.0.returns), bits(&other.0.returns));
        assert_eq!(bits(&one.0.turn_advantages), bits(&other.0.turn_advantages));
        assert_eq!(bits(&one.1.advantages), bits(&other.1.advantages));
        assert_eq!(one.2, other.2);
        assert_eq!(bits(&one.3.advantages), bits(&other.3.advantages));
        assert_eq!(bits(&one.3.returns), bits(&other.3.returns));
        assert_eq!(bits(&one.3.turn_advantages), bits(&other.3.turn_advantages));
    }
}
