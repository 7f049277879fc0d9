//! "Did you mean ...?" for a misspelt name (an estimator, an option, a column, a flag):
//! the one rule every layer uses, so a suggestion reads the same from Rust, Python and
//! the command line.

/// The candidate closest to `word`, if one is close enough to be a likely misspelling:
/// equal up to case, `-`/`_` and spaces, or within an edit distance (insertions, deletions,
/// substitutions, adjacent transpositions) of a third of the word's length, rounded up.
/// Ties go to the first candidate, so the answer is deterministic.
pub fn closest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let key = normalized(word);
    let limit = key.len().div_ceil(3);
    let mut best: Option<(usize, &'a str)> = None;
    for candidate in candidates {
        let distance = edit_distance(&key, &normalized(candidate));
        if distance <= limit && best.is_none_or(|(d, _)| distance < d) {
            best = Some((distance, candidate));
        }
    }
    best.map(|(_, candidate)| candidate)
}

/// `" (did you mean `X`?)"` for the closest candidate, or an empty string.
pub fn did_you_mean<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> String {
    closest(word, candidates).map(|c| format!(" (did you mean `{c}`?)")).unwrap_or_default()
}

fn normalized(word: &str) -> Vec<char> {
    word.trim_start_matches('-')
        .chars()
        .filter(|c| !c.is_whitespace())
        .map(|c| if c == '-' { '_' } else { c.to_ascii_lowercase() })
        .collect()
}

/// Optimal-string-alignment distance (Levenshtein plus adjacent transpositions).
fn edit_distance(a: &[char], b: &[char]) -> usize {
    let (n, m) = (a.len(), b.len());
    let mut rows = vec![vec![0usize; m + 1]; n + 1];
    for (i, row) in rows.iter_mut().enumerate() {
        row[0] = i;
    }
    rows[0] = (0..=m).collect();
    for i in 1..=n {
        for j in 1..=m {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut d = (rows[i - 1][j] + 1).min(rows[i][j - 1] + 1).min(rows[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                d = d.min(rows[i - 2][j - 2] + 1);
            }
            rows[i][j] = d;
        }
    }
    rows[n][m]
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPTIONS: [&str; 5] = ["lam", "lam_intra", "beta", "gamma", "lam_critic"];

    #[test]
    fn suggests_the_likely_misspelling() {
        assert_eq!(closest("lamb", OPTIONS), Some("lam"));
        assert_eq!(closest("lamda", OPTIONS), Some("lam"));
        assert_eq!(closest("lam_intr", OPTIONS), Some("lam_intra"));
        assert_eq!(closest("--lam-intra", OPTIONS), Some("lam_intra"));
        assert_eq!(closest("LAM_INTRA", OPTIONS), Some("lam_intra"));
        assert_eq!(closest("gmama", OPTIONS), Some("gamma")); // a transposition
        assert_eq!(closest("maee", ["mae", "gae", "grpo"]), Some("mae"));
        assert_eq!(closest("scores", ["mask", "score", "rewards"]), Some("score"));
    }

    #[test]
    fn suggests_nothing_far_away() {
        assert_eq!(closest("ppo", ["mae", "gae", "grpo", "drgrpo", "rloo", "bilevel"]), None);
        assert_eq!(closest("temperature", OPTIONS), None);
        assert_eq!(closest("x", std::iter::empty()), None);
        assert_eq!(did_you_mean("zzzz", OPTIONS), "");
        assert_eq!(did_you_mean("lamb", OPTIONS), " (did you mean `lam`?)");
    }
}
