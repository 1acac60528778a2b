//! The election rule the hand-over timing, the send probes and SGLang's scheduler loop share:
//! a candidate (a mailbox fd, a socket) wins once it has enough votes and more than the
//! current winner. Kept apart so that none of its users imports another.
use std::{
    collections::HashMap,
    hash::{BuildHasher, Hash},
};

/// One vote for `candidate`: true when it now has at least `needed` votes and more than the
/// current `winner`.
pub fn elected<K: Copy + Eq + Hash, S: BuildHasher>(
    votes: &mut HashMap<K, u32, S>,
    winner: Option<K>,
    candidate: K,
    needed: u32,
) -> bool {
    let count = votes.entry(candidate).or_default();
    *count += 1;
    let count = *count;
    let leader = winner.and_then(|w| votes.get(&w)).copied();
    count >= needed && leader.is_none_or(|l| count > l)
}
