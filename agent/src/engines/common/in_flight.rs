//! Engine requests being followed, by id, bounded: beyond the bound the oldest is dropped
//! (and counted by the caller), so a flood of requests whose end is never seen cannot grow
//! the agent without limit.
use std::collections::{HashMap, VecDeque};

pub struct InFlight<T> {
    requests: HashMap<String, T>,
    /// Insertion order, to find the oldest; may hold ids already removed.
    order: VecDeque<String>,
    max: usize,
}

impl<T> InFlight<T> {
    pub fn new(max: usize) -> Self {
        Self {
            requests: HashMap::new(),
            order: VecDeque::new(),
            max: max.max(1),
        }
    }

    /// Follow `request` under `id`; returns how many older requests were dropped for room.
    pub fn insert(&mut self, id: String, request: T) -> u64 {
        let mut evicted = 0;
        if self.requests.len() >= self.max && !self.requests.contains_key(&id) {
            while let Some(oldest) = self.order.pop_front() {
                if self.requests.remove(&oldest).is_some() {
                    evicted += 1;
                    break;
                }
            }
        }
        self.order.push_back(id.clone());
        self.requests.insert(id, request);
        // Ids of requests that ended stay in `order`: compact it now and then.
        if self.order.len() > 2 * self.max {
            let live = &self.requests;
            self.order.retain(|id| live.contains_key(id));
        }
        evicted
    }

    pub fn get(&self, id: &str) -> Option<&T> {
        self.requests.get(id)
    }

    pub fn get_mut(&mut self, id: &str) -> Option<&mut T> {
        self.requests.get_mut(id)
    }

    pub fn remove(&mut self, id: &str) -> Option<T> {
        self.requests.remove(id)
    }

    pub fn len(&self) -> usize {
        self.requests.len()
    }

    pub fn is_empty(&self) -> bool {
        self.requests.is_empty()
    }

    /// Forget everything (the session ends); returns how many were still followed.
    pub fn clear(&mut self) -> usize {
        let n = self.requests.len();
        self.requests.clear();
        self.order.clear();
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_live_request_makes_room_and_ended_ones_do_not_count() {
        let mut f = InFlight::new(2);
        assert_eq!(f.insert("a".into(), 1), 0);
        assert_eq!(f.insert("b".into(), 2), 0);
        assert_eq!(f.remove("a"), Some(1));
        assert_eq!(f.insert("c".into(), 3), 0, "room was left by a");
        assert_eq!(
            f.insert("d".into(), 4),
            1,
            "b, the oldest live one, is dropped"
        );
        assert!(f.get_mut("b").is_none());
        assert_eq!(f.get_mut("c"), Some(&mut 3));
        assert_eq!(f.insert("c".into(), 5), 0, "replacing is not growing");
        assert_eq!(f.len(), 2);
        for i in 0..100 {
            f.insert(format!("x{i}"), i);
        }
        assert!(f.order.len() <= 4 + 1);
        assert_eq!(f.clear(), 2);
        assert!(f.is_empty());
    }
}
