//! GiGPO's anchor states keyed exactly (docs/estimators.md, "GiGPO"): a turn's anchor hash
//! (64-bit FNV-1a) only finds the candidate states; the tokens decide. Two turns are one
//! state when their anchor tokens are equal, never because their hashes are: a colliding
//! pair of distinct observations is two states (issue 42, item 2). Ids given per turn
//! (`turn_state_ids`) have no tokens and are states by their value.
//!
//! Each state keeps its tokens once, as its own segment after its parent's: with the
//! `prefix` anchor a turn's state is the previous turn's state plus the tokens since that
//! turn started, so a history is stored once however many turns extend it; with the
//! `observation` anchor a state is its observation alone.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::hash::Hash;
use std::ops::Range;

/// No state (a state without a parent, the end of a collision chain).
const NONE: u32 = u32::MAX;

/// A turn's anchor tokens within its batch's token ids: the anchor state is
/// `tokens[content]`, of which `tokens[own..content.end]` follow the previous turn's state
/// (prefix anchor; `own == content.start` otherwise and for a trajectory's first turn).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AnchorSpan {
    pub content: Range<usize>,
    pub own: usize,
}

/// One turn's anchor state as it is looked up: its tokens (empty for ids given per turn),
/// the start of its own segment in them, and the state of its trajectory's previous turn
/// when its tokens extend that state's (prefix anchor).
#[derive(Debug, Clone, Copy)]
pub struct Candidate<'a> {
    pub tokens: &'a [i64],
    pub own: usize,
    pub parent: Option<u32>,
}

impl Candidate<'_> {
    /// A state given by id alone (no tokens).
    pub const ID: Candidate<'static> = Candidate { tokens: &[], own: 0, parent: None };
}

/// Dense anchor states (0, 1, … in order of first lookup) keyed by `K` (a hash, with
/// whatever else separates states, such as the group) and by their tokens.
#[derive(Debug)]
pub struct AnchorStates<K> {
    /// The first state of each key; states sharing a key (a hash collision) are chained.
    first: HashMap<K, u32>,
    states: Vec<State>,
    arena: Vec<i64>,
}

/// One state: the next with its key, its parent, its token count (its parent's included)
/// and its own segment in the arena (one record, so a new state is one push).
#[derive(Debug, Clone, Copy)]
struct State {
    next: u32,
    parent: u32,
    len: usize,
    seg: (usize, usize),
}

impl<K> Default for AnchorStates<K> {
    fn default() -> Self {
        AnchorStates { first: HashMap::new(), states: Vec::new(), arena: Vec::new() }
    }
}

impl<K: Hash + Eq> AnchorStates<K> {
    /// The number of states.
    pub fn len(&self) -> usize {
        self.states.len()
    }

    pub fn is_empty(&self) -> bool {
        self.states.is_empty()
    }

    /// The state of `c` under `key`, and whether it is new (then numbered `len() - 1`).
    pub fn resolve(&mut self, key: K, c: &Candidate<'_>) -> (u32, bool) {
        let fresh = self.states.len() as u32;
        let mut s = match self.first.entry(key) {
            Entry::Vacant(v) => {
                v.insert(fresh);
                self.push(c);
                return (fresh, true);
            }
            Entry::Occupied(o) => *o.get(),
        };
        loop {
            if self.holds(s, c) {
                return (s, false);
            }
            match self.states[s as usize].next {
                NONE => {
                    self.states[s as usize].next = fresh;
                    self.push(c);
                    return (fresh, true);
                }
                n => s = n,
            }
        }
    }

    /// The state of `c` under `key`, if it was resolved before.
    pub fn find(&self, key: &K, c: &Candidate<'_>) -> Option<u32> {
        let mut s = *self.first.get(key)?;
        loop {
            if self.holds(s, c) {
                return Some(s);
            }
            match self.states[s as usize].next {
                NONE => return None,
                n => s = n,
            }
        }
    }

    fn push(&mut self, c: &Candidate<'_>) {
        let (parent, own) = match c.parent {
            Some(p) if c.own > 0 => (p, &c.tokens[c.own..]),
            _ => (NONE, c.tokens),
        };
        let at = self.arena.len();
        self.arena.extend_from_slice(own);
        self.states.push(State { next: NONE, parent, len: c.tokens.len(), seg: (at, self.arena.len()) });
    }

    fn segment(&self, s: &State) -> &[i64] {
        &self.arena[s.seg.0..s.seg.1]
    }

    /// Whether state `s` holds exactly the tokens of `c`.
    fn holds(&self, s: u32, c: &Candidate<'_>) -> bool {
        let state = &self.states[s as usize];
        if state.len != c.tokens.len() {
            return false;
        }
        if state.len == 0 {
            return true; // ids given per turn, or an empty observation
        }
        // Same parent and length: the tokens before the own segments are equal (states are
        // exact), so the segments decide.
        if c.own > 0 && c.parent.is_some_and(|p| p == state.parent) {
            return self.segment(state) == &c.tokens[c.own..];
        }
        // Else the whole token sequence, the state's segments from its last.
        let (mut rest, mut state) = (c.tokens, state);
        loop {
            let seg = self.segment(state);
            if !rest.ends_with(seg) {
                return false;
            }
            rest = &rest[..rest.len() - seg.len()];
            match state.parent {
                NONE => return rest.is_empty(),
                p => state = &self.states[p as usize],
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_tokens_are_one_state_and_a_shared_key_is_not() {
        let mut s = AnchorStates::<u64>::default();
        let a = [1i64, 2, 3];
        let b = [1i64, 2, 4];
        let c = |t| Candidate { tokens: t, own: 0, parent: None };
        assert_eq!(s.resolve(7, &c(&a)), (0, true));
        // The same key (a forced collision) with other tokens: a new state, chained.
        assert_eq!(s.resolve(7, &c(&b)), (1, true));
        assert_eq!(s.resolve(7, &c(&a)), (0, false));
        assert_eq!(s.resolve(7, &c(&b)), (1, false));
        assert_eq!(s.find(&7, &c(&b)), Some(1));
        assert_eq!(s.find(&7, &c(&[1, 2])), None);
        assert_eq!(s.find(&8, &c(&a)), None);
        // Ids alone: one state per key.
        assert_eq!(s.resolve(9, &Candidate::ID), (2, true));
        assert_eq!(s.resolve(9, &Candidate::ID), (2, false));
        assert_eq!(s.len(), 3);
    }

    #[test]
    fn prefix_states_compare_whole_histories_however_split() {
        let mut s = AnchorStates::<u64>::default();
        let h = [5i64, 6, 7, 8];
        // Trajectory 1: [5, 6] then [5, 6, 7, 8] extending it.
        let (p, _) = s.resolve(1, &Candidate { tokens: &h[..2], own: 0, parent: None });
        let (q, fresh) = s.resolve(2, &Candidate { tokens: &h, own: 2, parent: Some(p) });
        assert!(fresh);
        // The same history read in one piece (another split of the turns) is that state.
        assert_eq!(s.find(&2, &Candidate { tokens: &h, own: 0, parent: None }), Some(q));
        // Or split elsewhere, from another parent.
        let (r, _) = s.resolve(3, &Candidate { tokens: &h[..1], own: 0, parent: None });
        assert_eq!(s.find(&2, &Candidate { tokens: &h, own: 1, parent: Some(r) }), Some(q));
        // A history that differs before the shared segment is not.
        let other = [4i64, 6, 7, 8];
        assert_eq!(s.find(&2, &Candidate { tokens: &other, own: 0, parent: None }), None);
        // The same parent and a different segment is not.
        assert_eq!(s.find(&2, &Candidate { tokens: &[5, 6, 7, 9], own: 2, parent: Some(p) }), None);
    }
}
