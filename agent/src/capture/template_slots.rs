//! Which slot of the kernel's `SSE_TEMPLATES` array holds each process's stream template.
//!
//! A traced write reads its process's template in place, by the slot its `TRACKED` entry names
//! (an array index where a second hash lookup was). So that a program run never reads a slot
//! while it is rewritten, each template goes to a fresh slot (the process's entry is pointed
//! at it once written), and a slot given back is taken again only after every other free slot
//! has been: the slots are handed out in turn.
use std::collections::HashMap;

pub struct TemplateSlots {
    /// Each process's slot.
    held: HashMap<u32, u32>,
    /// Whether each slot is held.
    taken: Vec<bool>,
    /// Where the search for the next free slot starts.
    next: usize,
}

impl TemplateSlots {
    pub fn new(slots: u32) -> Self {
        Self {
            held: HashMap::new(),
            taken: vec![false; slots as usize],
            next: 0,
        }
    }

    /// A free slot for a new template: the first free one after the last slot handed out;
    /// None when all are held. A process's former slot stays held until it holds the new one
    /// ([`TemplateSlots::hold`]): the kernel may read it until then.
    pub fn free_slot(&self) -> Option<u32> {
        let n = self.taken.len();
        (0..n)
            .map(|i| (self.next + i) % n)
            .find(|&slot| !self.taken[slot])
            .map(|slot| slot as u32)
    }

    /// Process `tgid` now holds `slot` (written, and its entry pointed at it); its former slot
    /// is given back.
    pub fn hold(&mut self, tgid: u32, slot: u32) {
        if let Some(former) = self.held.insert(tgid, slot) {
            self.taken[former as usize] = false;
        }
        self.taken[slot as usize] = true;
        self.next = (slot as usize + 1) % self.taken.len();
    }

    /// Process `tgid` has exited: its slot is given back.
    pub fn release(&mut self, tgid: u32) {
        if let Some(slot) = self.held.remove(&tgid) {
            self.taken[slot as usize] = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_handed_out_in_turn_and_one_given_back_is_taken_last() {
        let mut slots = TemplateSlots::new(3);
        let take = |slots: &mut TemplateSlots, tgid| {
            let slot = slots.free_slot().unwrap();
            slots.hold(tgid, slot);
            slot
        };
        assert_eq!(take(&mut slots, 10), 0);
        assert_eq!(take(&mut slots, 11), 1);
        // A new template of process 10 goes to a fresh slot; its former one is given back.
        assert_eq!(take(&mut slots, 10), 2);
        assert_eq!(slots.free_slot(), Some(0));
        slots.release(11);
        assert_eq!(take(&mut slots, 12), 0);
        // Slot 1 (given back by 11 after slot 0 was) is the only free one.
        assert_eq!(slots.free_slot(), Some(1));
        assert_eq!(take(&mut slots, 13), 1);
        assert_eq!(slots.free_slot(), None);
        slots.release(99);
        assert_eq!(slots.free_slot(), None);
    }
}
