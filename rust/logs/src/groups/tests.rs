use super::*;
use arrow::array::{DictionaryArray, Int64Array, StringArray};
use std::sync::Arc;

use crate::schema::check_group_type;

fn stats_over(params: GroupParams, batches: &[(RecordBatch, Vec<f32>)]) -> GroupStats {
    let mut stats = GroupStats::new(params);
    while stats.wants_scan() {
        for (b, s) in batches {
            stats.scan("g", b, s).unwrap();
        }
        stats.finish_scan().unwrap();
    }
    stats
}

/// Batches of an int64 group column `g` (with their scores), cut at `cuts`.
fn cut_into_batches(ids: &[i64], scores: &[f32], cuts: &[usize]) -> Vec<(RecordBatch, Vec<f32>)> {
    cuts.windows(2)
        .map(|w| {
            let g: ArrayRef = Arc::new(Int64Array::from(ids[w[0]..w[1]].to_vec()));
            (RecordBatch::try_from_iter([("g", g)]).unwrap(), scores[w[0]..w[1]].to_vec())
        })
        .collect()
}

fn lcg(seed: &mut u64) -> u64 {
    *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    *seed >> 33
}

#[test]
fn split_batches_match_the_core_bitwise() {
    let mut seed = 7u64;
    let n = 500;
    let ids: Vec<i64> = (0..n).map(|_| (lcg(&mut seed) % 37) as i64).collect();
    let scores: Vec<f32> = (0..n).map(|_| (lcg(&mut seed) % 1000) as f32 / 7.0 + 1e4).collect();
    let (_, codes) = {
        let mut uniq: Vec<i64> = ids.clone();
        uniq.sort();
        uniq.dedup();
        let codes: Vec<i64> = ids.iter().map(|i| uniq.binary_search(i).unwrap() as i64).collect();
        (uniq, codes)
    };
    let n_groups = codes.iter().max().unwrap() + 1;
    let batches = cut_into_batches(&ids, &scores, &[0, 1, 130, 131, 400, n]);
    for params in [
        GroupParams::default(),
        GroupParams { norm_std: false, ..Default::default() },
        GroupParams { leave_one_out: true, ..Default::default() },
    ] {
        let want = mpo_core::group_advantages(&scores, &codes, n_groups as usize, &params).unwrap();
        let stats = stats_over(params, &batches);
        let got: Vec<f32> = batches.iter().flat_map(|(b, s)| stats.advantages("g", b, s).unwrap()).collect();
        assert_eq!(got, want, "{params:?}");
    }
}

#[test]
fn float_ids_by_value_and_nan_refused() {
    // The group-id rule of mpo_rs.group_advantages (issue 11 item 6): numbers by value,
    // so 1.0 in a float column (or file) is the group 1 of an integer one, -0.0 is 0,
    // 2.5 a group of its own; NaN and ±inf are missing ids, refused like nulls.
    let floats: ArrayRef = Arc::new(Float64Array::from(vec![1.0, 2.5, -0.0, 2.5]));
    let ints: ArrayRef = Arc::new(Int64Array::from(vec![1, 0]));
    let batches = vec![
        (RecordBatch::try_from_iter([("g", floats)]).unwrap(), vec![1.0, 5.0, 3.0, 7.0]),
        (RecordBatch::try_from_iter([("g", ints)]).unwrap(), vec![3.0, 1.0]),
    ];
    let params = GroupParams { norm_std: false, ..Default::default() };
    let stats = stats_over(params, &batches);
    assert_eq!(stats.n_groups(), 3);
    // group 1 = {1, 3} (mean 2), group 2.5 = {5, 7} (mean 6), group 0 = {3, 1} (mean 2)
    assert_eq!(stats.advantages("g", &batches[0].0, &batches[0].1).unwrap(), vec![-1.0, -1.0, 1.0, 1.0]);
    assert_eq!(stats.advantages("g", &batches[1].0, &batches[1].1).unwrap(), vec![1.0, -1.0]);
    assert!(check_group_type("g", &DataType::Float32).is_ok());

    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let g: ArrayRef = Arc::new(arrow::array::Float32Array::from(vec![1.0, bad]));
        let b = RecordBatch::try_from_iter([("g", g)]).unwrap();
        let e = GroupStats::new(params).scan("g", &b, &[0.0, 0.0]).unwrap_err();
        assert!(matches!(&e, DataError::NonFiniteRow { row: 1, .. }), "{e}");
        assert!(e.to_string().starts_with("row 1, column `g`:"), "{e}");
    }
}

#[test]
fn overflowing_advantages_are_an_error_naming_the_row() {
    // RLOO over finite scores of ±3e38: 3e38 − (−3e38) is beyond f32 (issue 11 item 7).
    let g: ArrayRef = Arc::new(Int64Array::from(vec![0, 0]));
    let batches = vec![(RecordBatch::try_from_iter([("g", g)]).unwrap(), vec![3e38, -3e38])];
    let stats = stats_over(GroupParams { leave_one_out: true, ..Default::default() }, &batches);
    let e = stats.advantages("g", &batches[0].0, &batches[0].1).unwrap_err();
    assert!(matches!(e, DataError::NonFiniteRow { row: 0, .. }), "{e}");
}

#[test]
fn strings_dictionaries_and_nulls() {
    let plain: ArrayRef = Arc::new(StringArray::from(vec!["a", "b", "a"]));
    let dict: ArrayRef = Arc::new(
        DictionaryArray::<dt::Int32Type>::try_new(
            arrow::array::Int32Array::from(vec![1, 0]),
            Arc::new(StringArray::from(vec!["a", "b"])),
        )
        .unwrap(),
    );
    let batches = vec![
        (RecordBatch::try_from_iter([("g", plain)]).unwrap(), vec![1.0, 5.0, 3.0]),
        (RecordBatch::try_from_iter([("g", dict)]).unwrap(), vec![7.0, 2.0]),
    ];
    let params = GroupParams { norm_std: false, ..Default::default() };
    let stats = stats_over(params, &batches);
    assert_eq!(stats.n_groups(), 2);
    // group a = {1, 3, 2} (mean 2), group b = {5, 7} (mean 6)
    assert_eq!(stats.advantages("g", &batches[0].0, &batches[0].1).unwrap(), vec![-1.0, -1.0, 1.0]);
    assert_eq!(stats.advantages("g", &batches[1].0, &batches[1].1).unwrap(), vec![1.0, 0.0]);

    let with_null: ArrayRef = Arc::new(StringArray::from(vec![Some("a"), None]));
    let b = RecordBatch::try_from_iter([("g", with_null)]).unwrap();
    let e = GroupStats::new(params).scan("g", &b, &[0.0, 0.0]).unwrap_err();
    assert_eq!(e, DataError::NullValue { column: "g".into(), row: 1 });
}
#[test]
fn merged_partials_serve_every_group_estimator() {
    let mut seed = 3u64;
    let n = 400;
    let ids: Vec<i64> = (0..n).map(|_| (lcg(&mut seed) % 23) as i64 - 5).collect();
    let scores: Vec<f32> = (0..n).map(|_| (lcg(&mut seed) % 1000) as f32 / 9.0 - 20.0).collect();
    let batches = cut_into_batches(&ids, &scores, &[0, 3, 150, 151, 320, n]);
    let partials: Vec<RecordBatch> =
        batches.iter().map(|(b, s)| GroupStats::of_batches("g", &[(b, s)]).unwrap().to_table().unwrap()).collect();
    let merged = GroupStats::merge(GroupParams::default(), &partials, None).unwrap();
    let table = merged.to_table().unwrap();
    let keys = table.column(0).as_primitive::<dt::Int64Type>().values().to_vec();
    let mut want_keys = ids.clone();
    want_keys.sort();
    want_keys.dedup();
    assert_eq!(keys, want_keys, "one row per group, sorted");
    // Merging the merged table alone gives it back.
    assert_eq!(
        GroupStats::merge(GroupParams::default(), std::slice::from_ref(&table), None).unwrap().to_table().unwrap(),
        table
    );
    let count = table.column(1).as_primitive::<dt::Int64Type>().values();
    let m2 = table.column(4).as_primitive::<dt::Float64Type>().values();
    for (i, &k) in keys.iter().enumerate() {
        let member: Vec<f64> = (0..n).filter(|&j| ids[j] == k).map(|j| scores[j] as f64).collect();
        let mean = member.iter().sum::<f64>() / member.len() as f64;
        assert_eq!(count[i], member.len() as i64);
        let want: f64 = member.iter().map(|x| (x - mean) * (x - mean)).sum();
        assert!((m2[i] - want).abs() <= 1e-9 * want.max(1.0), "{k}: {} vs {want}", m2[i]);
    }
    let codes: Vec<i64> = ids.iter().map(|i| want_keys.binary_search(i).unwrap() as i64).collect();
    for params in [
        GroupParams::default(),
        GroupParams { norm_std: false, ..Default::default() },
        GroupParams { leave_one_out: true, ..Default::default() },
    ] {
        let want = mpo_core::group_advantages(&scores, &codes, want_keys.len(), &params).unwrap();
        let got: Vec<f32> =
            batches.iter().flat_map(|(b, s)| merged.advantages_for(&params, "g", b, s).unwrap()).collect();
        for (a, b) in got.iter().zip(&want) {
            assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{params:?}: {a} vs {b}");
        }
    }
    // Statistics without deviations refuse GRPO instead of dividing by a zero std.
    let dr = stats_over(GroupParams { norm_std: false, ..Default::default() }, &batches);
    assert!(dr.advantages_for(&GroupParams::default(), "g", &batches[0].0, &batches[0].1).is_err());
}

#[test]
fn ids_a_log_cannot_hold_together_are_refused_naming_the_inputs() {
    // issue 18 defect 8: int64 2^53 + 1 in one input and float ids in another were two
    // table rows keyed by the same float; strings beside numbers failed only in Ray.
    let stats_of = |inputs: Vec<(&str, ArrayRef)>| -> Result<GroupStats, DataError> {
        let mut stats = GroupStats::new(GroupParams { norm_std: false, ..Default::default() });
        for (source, ids) in inputs {
            stats.set_source(source);
            let n = ids.len();
            let b = RecordBatch::try_from_iter([("g", ids)]).unwrap();
            stats.scan("g", &b, &vec![1.0; n])?;
        }
        stats.finish_scan()?;
        Ok(stats)
    };
    let big: ArrayRef = Arc::new(Int64Array::from(vec![1 << 53, (1 << 53) + 1]));
    let floats: ArrayRef = Arc::new(Float64Array::from(vec![0.5, 2f64.powi(53)]));
    let e = stats_of(vec![("a", big.clone()), ("b", floats.clone())]).unwrap_err().to_string();
    assert!(e.contains("9007199254740993 in a has no exact float64, and b holds float ids"), "{e}");
    let e = stats_of(vec![("b", floats.clone()), ("a", big)]).unwrap_err().to_string();
    assert!(e.contains("9007199254740993 in a has no exact float64, and b holds float ids"), "{e}");
    let strings: ArrayRef = Arc::new(StringArray::from(vec!["1"]));
    let ints: ArrayRef = Arc::new(Int64Array::from(vec![1]));
    let e = stats_of(vec![("a", ints.clone()), ("b", strings)]).unwrap_err().to_string();
    assert!(e.contains("string group ids in b but number ids in a"), "{e}");
    // A uint64 id beyond int64 beside signed ids: refused, unless float ids make the
    // one type float64 (which holds 2^63 exactly).
    let huge: ArrayRef = Arc::new(UInt64Array::from(vec![1u64 << 63]));
    let e = stats_of(vec![("a", ints.clone()), ("b", huge.clone())]).unwrap_err().to_string();
    assert!(e.contains("9223372036854775808 in b is beyond int64, and a holds signed"), "{e}");
    let ok = stats_of(vec![("a", ints), ("b", huge), ("c", floats)]).unwrap();
    let t = ok.to_table().unwrap();
    assert_eq!(t.column(0).data_type(), &DataType::Float64);
    assert_eq!(t.num_rows(), 4);
}

#[test]
fn statistics_tables_keep_the_id_type() {
    let floats: ArrayRef = Arc::new(Float64Array::from(vec![2.5, 1.0, -0.0]));
    let b = RecordBatch::try_from_iter([("g", floats)]).unwrap();
    let t = GroupStats::of_batches("g", &[(&b, &[1.0, 2.0, 3.0])]).unwrap().to_table().unwrap();
    assert_eq!(t.column(0).as_primitive::<dt::Float64Type>().values().to_vec(), vec![0.0, 1.0, 2.5]);
    let strings: ArrayRef = Arc::new(StringArray::from(vec!["b", "a", "b"]));
    let b = RecordBatch::try_from_iter([("g", strings)]).unwrap();
    let t = GroupStats::of_batches("g", &[(&b, &[1.0, 2.0, 3.0])]).unwrap().to_table().unwrap();
    assert_eq!(t.column(0).as_string::<i64>().iter().flatten().collect::<Vec<_>>(), vec!["a", "b"]);
    assert_eq!(t.column(2).as_primitive::<dt::Float64Type>().values().to_vec(), vec![2.0, 4.0]);
    assert_eq!(t.column(4).as_primitive::<dt::Float64Type>().values().to_vec(), vec![0.0, 2.0]);
    let f = |x: f64| -> ArrayRef { Arc::new(Float64Array::from(vec![x])) };
    let g: ArrayRef = Arc::new(Int64Array::from(vec![1]));
    let bad =
        RecordBatch::try_from_iter(STATISTICS_COLUMNS.into_iter().zip([g, f(1.5), f(0.0), f(0.0), f(0.0)])).unwrap();
    let e = GroupStats::merge(GroupParams::default(), &[bad], None).unwrap_err();
    assert!(e.to_string().contains("count 1.5"), "{e}");
}
