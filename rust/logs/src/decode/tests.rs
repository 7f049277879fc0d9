use super::*;
use arrow::array::{BooleanBuilder, Float64Array, Int64Array, LargeListArray, ListArray, ListBuilder, UInt8Array};
use arrow::datatypes::{DataType, Field, Float32Type};
use std::sync::Arc;

fn f32_list(rows: &[Option<Vec<Option<f32>>>]) -> ArrayRef {
    Arc::new(ListArray::from_iter_primitive::<Float32Type, _, _>(rows.iter().cloned()))
}

fn bool_list(rows: &[Vec<bool>]) -> ArrayRef {
    let mut b = ListBuilder::new(BooleanBuilder::new());
    for r in rows {
        for &x in r {
            b.values().append_value(x);
        }
        b.append(true);
    }
    Arc::new(b.finish())
}

fn batch(cols: Vec<(&str, ArrayRef)>) -> RecordBatch {
    RecordBatch::try_from_iter(cols).unwrap()
}

fn cols(reward: RewardColumn) -> Columns {
    Columns {
        mask: "loss_mask".into(),
        values: Some("values".into()),
        reward,
        group: None,
        observation_rewards: Default::default(),
        truncated: None,
        check: None,
        anchors: None,
    }
}

#[test]
fn reads_bool_masks_f32_values_and_scores() {
    let b = batch(vec![
        ("loss_mask", bool_list(&[vec![false, true, true], vec![true]])),
        ("values", f32_list(&[Some(vec![Some(0.0), Some(1.0), Some(2.0)]), Some(vec![Some(3.0)])])),
        ("score", Arc::new(Float64Array::from(vec![1.0, 0.5])) as ArrayRef),
    ]);
    let r = Rollouts::read(&b, &cols(RewardColumn::Score("score".into()))).unwrap();
    assert_eq!(&*r.offsets, &[0, 3, 4]);
    assert_eq!(&*r.mask, &[0, 1, 1, 1]);
    assert!(matches!(r.values, Some(Cow::Borrowed(v)) if v == [0.0, 1.0, 2.0, 3.0]));
    assert!(matches!(r.rewards, RewardData::Score(ref s) if **s == [1.0, 0.5]));
}

#[test]
fn float64_beyond_float32_is_named_with_its_value_not_as_inf() {
    use arrow::datatypes::Float64Type;
    let f64_list = |rows: Vec<Vec<f64>>| -> ArrayRef {
        Arc::new(ListArray::from_iter_primitive::<Float64Type, _, _>(
            rows.into_iter().map(|r| Some(r.into_iter().map(Some))),
        ))
    };
    let mask = bool_list(&[vec![true; 2], vec![true; 4]]);
    let values = f64_list(vec![vec![0.0, 1.0], vec![0.0, -3.4e38, 2.0, 1e300]]);
    let scores: ArrayRef = Arc::new(Float64Array::from(vec![1.0, 0.0]));
    let b = batch(vec![("loss_mask", mask.clone()), ("values", values), ("score", scores)]);
    let e = Rollouts::read(&b, &cols(RewardColumn::Score("score".into()))).unwrap_err();
    assert_eq!(e.to_string(), "row 1, column `values`: 1e300 at token 3 is outside float32's range");
    // Rounding to float32's largest value is in range; inf and NaN stay "not finite".
    let edge = f64_list(vec![vec![f32::MAX as f64 * (1.0 + 1e-9), f64::INFINITY], vec![f64::NAN; 4]]);
    let scores: ArrayRef = Arc::new(Float64Array::from(vec![-1e39, 0.0]));
    let b = batch(vec![("loss_mask", mask), ("values", edge), ("score", scores)]);
    let e = Rollouts::read(&b, &cols(RewardColumn::Score("score".into()))).unwrap_err();
    assert_eq!(e.to_string(), "row 0, column `score`: -1e39 is outside float32's range");
    let b = b.project(&[0, 1]).unwrap();
    let r = Rollouts::read(&b, &Columns { values: None, ..cols(RewardColumn::Token("values".into())) }).unwrap();
    assert!(matches!(r.rewards, RewardData::Token(ref v) if v[0] == f32::MAX && v[1].is_infinite()));
    // Token rewards whose sum leaves float32 are refused by the score pass.
    let big = f64_list(vec![vec![0.0; 2], vec![0.0, 2f64.powi(127), 2f64.powi(127), 0.0]]);
    let b = batch(vec![("loss_mask", bool_list(&[vec![true; 2], vec![true; 4]])), ("rewards", big)]);
    let e = read_row_scores(&b, &RewardColumn::Token("rewards".into())).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!("row 1, column `rewards`: the rewards sum to {:e}, outside float32's range", 2f64.powi(128))
    );
}

#[test]
fn a_per_turn_value_beyond_float32_is_named_by_its_turn() {
    use arrow::datatypes::Float64Type;
    let turns: ArrayRef =
        Arc::new(ListArray::from_iter_primitive::<Float64Type, _, _>(vec![Some(vec![Some(0.0), Some(1e300)])]));
    let mask = bool_list(&[vec![true, false, true]]);
    let b = batch(vec![("loss_mask", mask), ("values", f32_list(&[Some(vec![Some(0.0); 3])])), ("tr", turns)]);
    let want = "row 0, column `tr`: 1e300 at turn 1 is outside float32's range";
    let e = Rollouts::read(&b, &cols(RewardColumn::Turn("tr".into()))).unwrap_err();
    assert_eq!(e.to_string(), want);
    assert_eq!(read_row_scores(&b, &RewardColumn::Turn("tr".into())).unwrap_err().to_string(), want);
}

#[test]
fn sliced_batches_are_rebased() {
    let mask = bool_list(&[vec![true; 2], vec![false, true], vec![true; 3]]);
    let values = f32_list(&[Some(vec![Some(9.0); 2]), Some(vec![Some(1.0), Some(2.0)]), Some(vec![Some(3.0); 3])]);
    let scores: ArrayRef = Arc::new(Float64Array::from(vec![0.0, 1.0, 2.0]));
    let b = batch(vec![("loss_mask", mask), ("values", values), ("score", scores)]).slice(1, 2);
    let r = Rollouts::read(&b, &cols(RewardColumn::Score("score".into()))).unwrap();
    assert_eq!(&*r.offsets, &[0, 2, 5]);
    assert_eq!(&*r.mask, &[0, 1, 1, 1, 1]);
    assert_eq!(&**r.values.as_ref().unwrap(), &[1.0, 2.0, 3.0, 3.0, 3.0]);
    match r.list_offsets {
        ListOffsets::Small(o) => assert_eq!(&o[..], &[0, 2, 5]),
        _ => panic!("list in, list out"),
    }
}

#[test]
fn large_lists_and_uint8_masks_are_borrowed() {
    let offsets = OffsetBuffer::new(ScalarBuffer::from(vec![0i64, 2, 3]));
    let mask: ArrayRef = Arc::new(LargeListArray::new(
        Arc::new(Field::new_list_field(DataType::UInt8, true)),
        offsets.clone(),
        Arc::new(UInt8Array::from(vec![1, 0, 1])),
        None,
    ));
    let values: ArrayRef = Arc::new(LargeListArray::new(
        Arc::new(Field::new_list_field(DataType::Float64, true)),
        offsets,
        Arc::new(Float64Array::from(vec![0.5, 1.5, 2.5])),
        None,
    ));
    let rewards = values.clone();
    let b = batch(vec![("loss_mask", mask), ("values", values), ("rewards", rewards)]);
    let r = Rollouts::read(&b, &cols(RewardColumn::Token("rewards".into()))).unwrap();
    assert!(matches!(r.mask, Cow::Borrowed(m) if m == [1, 0, 1]));
    assert_eq!(&**r.values.as_ref().unwrap(), &[0.5, 1.5, 2.5]);
    assert!(matches!(r.list_offsets, ListOffsets::Large(_)));
}

#[test]
fn nulls_are_refused_with_row_and_token() {
    let mask = bool_list(&[vec![true; 2], vec![true; 3]]);
    let values = f32_list(&[Some(vec![Some(0.0); 2]), Some(vec![Some(0.0), None, Some(1.0)])]);
    let scores: ArrayRef = Arc::new(Float64Array::from(vec![0.0, 1.0]));
    let b = batch(vec![("loss_mask", mask.clone()), ("values", values), ("score", scores.clone())]);
    let e = Rollouts::read(&b, &cols(RewardColumn::Score("score".into()))).unwrap_err();
    assert_eq!(e, DataError::NullElement { column: "values".into(), row: 1, token: 1 });

    let values = f32_list(&[Some(vec![Some(0.0); 2]), None]);
    let b = batch(vec![("loss_mask", mask.clone()), ("values", values), ("score", scores)]);
    let e = Rollouts::read(&b, &cols(RewardColumn::Score("score".into()))).unwrap_err();
    assert_eq!(e, DataError::NullList { column: "values".into(), row: 1 });

    let values = f32_list(&[Some(vec![Some(0.0); 2]), Some(vec![Some(0.0); 3])]);
    let scores: ArrayRef = Arc::new(Float64Array::from(vec![Some(0.0), None]));
    let b = batch(vec![("loss_mask", mask), ("values", values), ("score", scores)]);
    let e = Rollouts::read(&b, &cols(RewardColumn::Score("score".into()))).unwrap_err();
    assert_eq!(e, DataError::NullValue { column: "score".into(), row: 1 });
}

#[test]
fn first_null_finds_leading_and_inner_nulls() {
    let n = NullBuffer::from(vec![true, false, true, true]);
    assert_eq!(first_null(Some(&n), 0..4), Some(1));
    assert_eq!(first_null(Some(&n), 1..4), Some(1));
    assert_eq!(first_null(Some(&n), 2..4), None);
    let n = NullBuffer::from(vec![false, false, true]);
    assert_eq!(first_null(Some(&n), 0..3), Some(0));
    assert_eq!(first_null(Some(&n), 1..3), Some(1));
}

#[test]
fn lengths_must_agree_within_a_row() {
    let mask = bool_list(&[vec![true; 2], vec![true; 3]]);
    let values = f32_list(&[Some(vec![Some(0.0); 2]), Some(vec![Some(0.0); 2])]);
    let scores: ArrayRef = Arc::new(Float64Array::from(vec![0.0, 1.0]));
    let b = batch(vec![("loss_mask", mask), ("values", values), ("score", scores)]);
    let e = Rollouts::read(&b, &cols(RewardColumn::Score("score".into()))).unwrap_err();
    assert_eq!(e.to_string(), "row 1: column `values` has 2 tokens but `loss_mask` has 3");
}

#[test]
fn integer_masks_must_be_zero_or_one() {
    let mask: ArrayRef = Arc::new(ListArray::from_iter_primitive::<dt::Int64Type, _, _>(vec![
        Some(vec![Some(1), Some(0)]),
        Some(vec![Some(1), Some(2)]),
    ]));
    let values = f32_list(&[Some(vec![Some(0.0); 2]), Some(vec![Some(0.0); 2])]);
    let scores: ArrayRef = Arc::new(Int64Array::from(vec![0, 1]));
    let b = batch(vec![("loss_mask", mask), ("values", values), ("score", scores)]);
    let e = Rollouts::read(&b, &cols(RewardColumn::Score("score".into()))).unwrap_err();
    assert_eq!(e, DataError::MaskValue { column: "loss_mask".into(), row: 1, token: 1, value: 2 });
}

#[test]
fn locate_skips_empty_rows() {
    let o = OffsetBuffer::new(ScalarBuffer::from(vec![0i32, 2, 2, 2, 5]));
    let raw = RawOffsets::Small(&o);
    assert_eq!(raw.locate(0), (0, 0));
    assert_eq!(raw.locate(1), (0, 1));
    assert_eq!(raw.locate(2), (3, 0));
    assert_eq!(raw.locate(4), (3, 2));
}

#[test]
fn bits_unpack_across_word_boundaries() {
    let bits: Vec<bool> = (0..150).map(|i| i % 3 == 0).collect();
    let b = BooleanArray::from(bits.clone());
    let got = unpack_bits(&b, 5..140);
    let want: Vec<u8> = bits[5..140].iter().map(|&x| x as u8).collect();
    assert_eq!(got, want);
}
