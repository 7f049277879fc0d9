//! The Parquet pipeline without Python, for profiling and memory measurements:
//! `cargo run -p mpo-logs --release --example advantages -- INPUT OUTPUT [BATCH_MIB] [ROW_GROUP_MIB]`
//! (MAE with the paper's parameters, default columns).

use mpo_logs::{run, ColumnSpec, Estimator, Job, Tuning};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 {
        eprintln!("usage: advantages INPUT OUTPUT [BATCH_MIB] [ROW_GROUP_MIB]");
        std::process::exit(2);
    }
    let mib = |i: usize, default: usize| args.get(i).and_then(|s| s.parse::<usize>().ok()).map_or(default, |m| m << 20);
    let defaults = Tuning::default();
    let job = Job {
        input: args[1].clone().into(),
        output: args[2].clone().into(),
        estimator: Estimator::from_options("mae", &[]).expect("valid defaults"),
        columns: ColumnSpec::default(),
        tuning: Tuning {
            batch_bytes: mib(3, defaults.batch_bytes),
            max_row_group_bytes: mib(4, defaults.max_row_group_bytes),
        },
    };
    match run(&job, None, &mut |_| true) {
        Ok(s) => println!(
            "{} rows, {} tokens, {} turns in {:.2} s ({:.1}M tokens/s)",
            s.counts.rows,
            s.counts.tokens,
            s.counts.turns,
            s.seconds,
            s.counts.tokens as f64 / s.seconds / 1e6
        ),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(if e.is_usage() { 2 } else { 1 });
        }
    }
}
