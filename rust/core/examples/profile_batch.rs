//! Times each estimator on a synthetic agentic batch, for profiling the core alone
//! (`perf record`, `valgrind --tool=callgrind`). `WHICH=gae` runs one estimator,
//! `REPS=n` sets the repeats. The benchmarks users read live in `benches/`.
use std::time::Instant;

use mpo_core::{gae_advantages, mae_advantages, segment_turns, GaeParams, MaeParams, Rewards};

fn main() {
    let (n_traj, turns, turn_len, obs_len) = (1000usize, 8usize, 120usize, 300usize);
    let (mut mask, mut offsets) = (Vec::new(), vec![0i64]);
    for _ in 0..n_traj {
        for _ in 0..turns {
            mask.extend(std::iter::repeat_n(0u8, obs_len));
            mask.extend(std::iter::repeat_n(1u8, turn_len));
        }
        offsets.push(mask.len() as i64);
    }
    let values: Vec<f32> = (0..mask.len()).map(|i| (i % 97) as f32 / 97.0).collect();
    let mut rewards = vec![0f32; mask.len()];
    for j in 0..n_traj {
        rewards[offsets[j + 1] as usize - 1] = 1.0;
    }
    let reps: usize = std::env::var("REPS").ok().and_then(|s| s.parse().ok()).unwrap_or(20);
    let which = std::env::var("WHICH").unwrap_or_default();
    let time = |name: &str, f: &dyn Fn()| {
        if !which.is_empty() && name != which {
            return;
        }
        f();
        let t = Instant::now();
        for _ in 0..reps {
            f();
        }
        println!("{name}: {:.2} ms", t.elapsed().as_secs_f64() * 1e3 / reps as f64);
    };
    println!("{} tokens", mask.len());
    time("copy", &|| {
        std::hint::black_box((values.clone(), rewards.clone()));
    });
    time("segment", &|| {
        std::hint::black_box(segment_turns(&mask, &offsets).expect("the synthetic batch is valid"));
    });
    time("gae", &|| {
        let p = GaeParams::default();
        std::hint::black_box(
            gae_advantages(&values, &mask, &offsets, Rewards::Token(&rewards), &p)
                .expect("the synthetic batch is valid"),
        );
    });
    time("mae", &|| {
        let p = MaeParams::default();
        std::hint::black_box(
            mae_advantages(&values, &mask, &offsets, Rewards::Token(&rewards), &p)
                .expect("the synthetic batch is valid"),
        );
    });
}
