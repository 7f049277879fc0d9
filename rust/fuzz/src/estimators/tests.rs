use super::*;

/// The target does draw truncation flags and per-turn rewards, and such cases pass.
#[test]
fn truncation_and_turn_rewards_are_drawn_and_checked() {
    let (mut state, mut truncated, mut per_turn) = (0x2545_f491_4f6c_dd1du64, 0, 0);
    for _ in 0..3000 {
        let data: Vec<u8> = (0..2048)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect();
        let Ok(c) = Case::decode(&data) else { continue };
        let estimator = matches!(c.kind, Kind::Mae | Kind::Gae);
        truncated += (estimator && c.truncated.contains(&true)) as u32;
        per_turn += c.turn_rewards.is_some() as u32;
        check_case(&c, true).unwrap_or_else(|f| panic!("{f:?}: {c:?}"));
    }
    assert!(truncated > 50 && per_turn > 50, "truncated {truncated}, per-turn {per_turn}");
}
