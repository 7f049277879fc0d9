//! GiGPO's kernel (rust/core/src/gigpo.rs) on hand-computed batches, its typed errors, and
//! the same bits for any thread count.

use mpo_core::*;

// Group 0: A = [obs, t0 t0, obs, t1], B = [obs, t0, obs, t1]; group 1: C = [obs, t0].
const MASK: [u8; 11] = [0, 1, 1, 0, 1, 0, 1, 0, 1, 0, 1];
const OFFSETS: [i64; 4] = [0, 5, 9, 11];
const GROUPS: [i64; 3] = [0, 0, 1];
const SCORES: [f32; 3] = [1.0, 0.0, 5.0];
// Observations: A [100] then [200]; B [100] then [200]; C [100]. B's first turn differs
// from A's, so their second turns share an observation but not a prefix.
const TOKENS: [i64; 11] = [100, 1, 2, 200, 3, 100, 4, 200, 5, 100, 9];

fn run(anchors: Anchors<'_>, params: &GigpoParams) -> Result<GigpoOutput> {
    let groups = Groups { index: &GROUPS, n_groups: 2 };
    gigpo_advantages(&MASK, &OFFSETS, Rewards::Score(&SCORES), groups, anchors, params)
}

fn ids(ids: &[i64]) -> Anchors<'_> {
    Anchors { turn_state_ids: Some(TurnIds { ids, offsets: None }), token_ids: None }
}

fn close(got: &[f32], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
    for (g, w) in got.iter().zip(want) {
        assert!((*g as f64 - w).abs() < 1e-6, "{got:?} vs {want:?}");
    }
}

#[test]
fn hand_computed_example() {
    // gamma 0.5: G(A) = [0.5, 1], G(B) = [0, 0], G(C) = [5]. Episode: A +0.5, B −0.5,
    // C alone 0. Step groups: {A0, B0} (state 10) → ±0.25; A1 (20), B1 (30), C0 alone → 0.
    let p = GigpoParams { gamma: 0.5, ..Default::default() };
    let out = run(ids(&[10, 20, 10, 30, 10]), &p).unwrap();
    close(&out.episode_advantages, &[0.5, -0.5, 0.0]);
    close(&out.step_advantages, &[0.25, 0.0, -0.25, 0.0, 0.0]);
    assert_eq!(out.step_groups, vec![0, 1, 0, 2, 3]);
    close(&out.turn_advantages, &[0.75, 0.5, -0.75, -0.5, 0.0]);
    close(&out.advantages, &[0.0, 0.75, 0.75, 0.0, 0.5, 0.0, -0.75, 0.0, -0.5, 0.0, 0.0]);
    assert_eq!(out.turns.n_turns(), 5);
    // step_weight scales A_S only; norm_std divides both by (unbiased std + eps).
    let w = run(ids(&[10, 20, 10, 30, 10]), &GigpoParams { step_weight: 2.0, ..p }).unwrap();
    close(&w.turn_advantages, &[1.0, 0.5, -1.0, -0.5, 0.0]);
    let s = run(ids(&[10, 20, 10, 30, 10]), &GigpoParams { norm_std: true, ..p }).unwrap();
    let (ep_std, step_std) = (0.5f64.sqrt(), (0.125f64).sqrt());
    close(&s.episode_advantages, &[0.5 / (ep_std + 1e-6), -0.5 / (ep_std + 1e-6), 0.0]);
    close(&s.step_advantages, &[0.25 / (step_std + 1e-6), 0.0, -0.25 / (step_std + 1e-6), 0.0, 0.0]);
}

#[test]
fn anchors_from_token_ids() {
    let p = GigpoParams { gamma: 0.5, ..Default::default() };
    let tokens = Anchors { turn_state_ids: None, token_ids: Some(&TOKENS) };
    // Observation: A1 and B1 both follow [200]: one step group, G = 1 and 0.
    let obs = run(tokens, &p).unwrap();
    assert_eq!(obs.step_groups, vec![0, 1, 0, 1, 2]);
    close(&obs.step_advantages, &[0.25, 0.5, -0.25, -0.5, 0.0]);
    // Prefix: their histories differ (B's first turn is another action).
    let prefix = run(tokens, &GigpoParams { anchor: Anchor::Prefix, ..p }).unwrap();
    assert_eq!(prefix.step_groups, vec![0, 1, 0, 2, 3]);
    // Both sources are refused: one would be left unread (issue 42 item 9).
    let both = Anchors { turn_state_ids: Some(TurnIds { ids: &[1, 2, 3, 4, 5], offsets: None }), ..tokens };
    let e = run(both, &p).unwrap_err().to_string();
    assert!(e.contains("not both"), "{e}");
    // The hash is FNV-1a 64 over little-endian int64 bytes (fixed: logs may store it).
    assert_eq!(anchor_hash(&[]), 0xcbf2_9ce4_8422_2325);
    assert_ne!(anchor_hash(&[1, 2]), anchor_hash(&[2, 1]));
    assert_ne!(anchor_hash(&[0]), anchor_hash(&[]));
}

#[test]
fn token_rewards_are_summed_per_turn() {
    let mut r = [0f32; 11];
    (r[1], r[2], r[4]) = (0.25, 0.5, 1.0); // A: turn rewards 0.75, 1
    r[8] = 2.0; // B: 0, 2
    r[10] = -1.0;
    let groups = Groups { index: &GROUPS, n_groups: 2 };
    let p = GigpoParams { gamma: 0.5, ..Default::default() };
    let out = gigpo_advantages(&MASK, &OFFSETS, Rewards::Token(&r), groups, ids(&[10, 20, 10, 30, 10]), &p).unwrap();
    // R(A) = 1.75, R(B) = 2: A_E = ∓0.125. G(A0) = 0.75 + 0.5, G(B0) = 1: A_S = ±0.125.
    close(&out.episode_advantages, &[-0.125, 0.125, 0.0]);
    close(&out.step_advantages, &[0.125, 0.0, -0.125, 0.0, 0.0]);
}

#[test]
fn bad_inputs_name_where() {
    let p = GigpoParams::default();
    let e = run(Anchors::default(), &p).unwrap_err();
    assert!(e.to_string().contains("`turn_state_ids`"), "{e}");
    let e = run(ids(&[1, 2, 3]), &p).unwrap_err().to_string();
    assert!(e.contains("`turn_state_ids` has length 3, expected 5"), "{e}");
    let ragged = Anchors {
        turn_state_ids: Some(TurnIds { ids: &[1, 2, 3, 4, 5], offsets: Some(&[0, 1, 4, 5]) }),
        token_ids: None,
    };
    let e = run(ragged, &p).unwrap_err();
    assert_eq!(e, MpoError::TurnCount { arg: "turn_state_ids", trajectory: 0, got: 1, expected: 2 });
    let e = run(Anchors { turn_state_ids: None, token_ids: Some(&TOKENS[..10]) }, &p).unwrap_err().to_string();
    assert!(e.contains("`token_ids` has length 10, expected 11"), "{e}");
    let groups = Groups { index: &[0, 2, 1], n_groups: 2 };
    let e = gigpo_advantages(&MASK, &OFFSETS, Rewards::Score(&SCORES), groups, ids(&[0; 5]), &p).unwrap_err();
    assert!(matches!(e, MpoError::GroupIndex { trajectory: 1, .. }), "{e}");
    let groups = Groups { index: &GROUPS, n_groups: 2 };
    let e =
        gigpo_advantages(&MASK, &OFFSETS, Rewards::Score(&[1.0, f32::NAN, 0.0]), groups, ids(&[0; 5]), &p).unwrap_err();
    assert!(matches!(e, MpoError::NonFiniteTrajectory { trajectory: 1, .. }), "{e}");
    let mut r = [0f32; 11];
    r[7] = 1.0; // an observation token of B
    let e = gigpo_advantages(&MASK, &OFFSETS, Rewards::Token(&r), groups, ids(&[0; 5]), &p).unwrap_err();
    assert!(e.to_string().contains("trajectory 1, position 2"), "{e}");
    r[7] = 0.0;
    r[6] = f32::INFINITY;
    let e = gigpo_advantages(&MASK, &OFFSETS, Rewards::Token(&r), groups, ids(&[0; 5]), &p).unwrap_err();
    assert!(matches!(e, MpoError::NonFiniteToken { arg: "rewards", .. }), "{e}");
    let mut m = MASK;
    m[3] = 2;
    let e = gigpo_advantages(&m, &OFFSETS, Rewards::Score(&SCORES), groups, ids(&[0; 5]), &p).unwrap_err();
    assert!(matches!(e, MpoError::MaskValue { value: 2, .. }), "{e}");
    // Scores near float32's limit: A_E + A_S overflows and is named; so does a return
    // summed over turns beyond float32.
    let big = [3e38f32, -3e38, 0.0];
    let e = gigpo_advantages(&MASK, &OFFSETS, Rewards::Score(&big), groups, ids(&[0; 5]), &p).unwrap_err();
    assert!(matches!(e, MpoError::NonFiniteOutput { output: "advantages", at: TokenAt { token: 1, .. }, .. }), "{e}");
    let mut r = [0f32; 11];
    (r[2], r[4], r[8]) = (3e38, 3e38, -3e38);
    let e = gigpo_advantages(&MASK, &OFFSETS, Rewards::Token(&r), groups, ids(&[0, 1, 2, 3, 4]), &p).unwrap_err();
    assert!(
        matches!(e, MpoError::NonFiniteTrajectoryOutput { output: "episode_advantages", trajectory: 0, .. }),
        "{e}"
    );
}

#[test]
fn bitwise_identical_for_any_thread_count() {
    let mut seed = 7u64;
    let mut next = move || {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        seed >> 33
    };
    let (mut mask, mut offsets, mut tokens, mut rewards) = (vec![], vec![0i64], vec![], vec![]);
    let n = 2000;
    for _ in 0..n {
        let len = 1 + next() % 40;
        for _ in 0..len {
            let m = (next() % 3 != 0) as u8;
            mask.push(m);
            tokens.push((next() % 4) as i64);
            rewards.push(if m == 1 { (next() % 100) as f32 / 37.0 - 1.0 } else { 0.0 });
        }
        offsets.push(mask.len() as i64);
    }
    let groups: Vec<i64> = (0..n).map(|_| (next() % 150) as i64).collect();
    let compute = |threads: usize, anchor: Anchor| {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        pool.install(|| {
            let g = Groups { index: &groups, n_groups: 150 };
            let a = Anchors { turn_state_ids: None, token_ids: Some(&tokens) };
            let p = GigpoParams { norm_std: true, anchor, ..Default::default() };
            gigpo_advantages(&mask, &offsets, Rewards::Token(&rewards), g, a, &p).unwrap()
        })
    };
    for anchor in [Anchor::Observation, Anchor::Prefix] {
        let one = compute(1, anchor);
        assert!(one.step_advantages.iter().any(|&a| a != 0.0));
        for threads in [2, 3, 8] {
            let many = compute(threads, anchor);
            let bits = |o: &GigpoOutput| {
                let f = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                (f(&o.advantages), f(&o.episode_advantages), f(&o.step_advantages), o.step_groups.clone())
            };
            assert_eq!(bits(&one), bits(&many), "{threads} threads, {anchor:?}");
        }
    }
}
