//! The block lifecycle: every state a logical KV block can be in, and the one table of
//! transitions allowed between them (checked on every transition in debug builds, and by the
//! randomized pool test in all builds through [`allowed`]).

/// State of one logical block of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BlockState {
    /// In HBM; no valid DRAM copy (being filled, or full and not yet written back).
    Dirty,
    /// In HBM; the eager writeback to its DRAM mirror is in flight.
    WritingBack,
    /// In HBM and its DRAM mirror holds the same bytes.
    Synced,
    /// Rotating out: the copy to DRAM is in flight; the HBM slot is still held.
    Evicting,
    /// Only in DRAM (the request is rotary).
    Parked,
    /// Rotating in: the copy from DRAM into a fresh HBM slot is in flight.
    Restoring,
    /// Released (terminal).
    Freed,
}

use BlockState::*;

/// Every allowed `(from, to)` pair. Anything else is a bug.
pub const TRANSITIONS: &[(BlockState, BlockState)] = &[
    // A full dirty block is written back eagerly; the copy lands.
    (Dirty, WritingBack),
    (WritingBack, Synced),
    // A synced tail block receives new tokens: its mirror is stale again.
    (Synced, Dirty),
    // Rotation out: unsynced blocks are copied; synced ones just drop their HBM slot; a block
    // whose writeback is in flight finishes that copy as its eviction.
    (Dirty, Evicting),
    (WritingBack, Evicting),
    (Evicting, Parked),
    (Synced, Parked),
    // Rotation in.
    (Parked, Restoring),
    (Restoring, Synced),
    // Finish, abort or recompute: any live state may be released (in-flight slots are
    // quarantined until their copy lands).
    (Dirty, Freed),
    (WritingBack, Freed),
    (Synced, Freed),
    (Evicting, Freed),
    (Parked, Freed),
    (Restoring, Freed),
];

/// Whether `from -> to` is in [`TRANSITIONS`].
pub fn allowed(from: BlockState, to: BlockState) -> bool {
    TRANSITIONS.iter().any(|&(f, t)| f == from && t == to)
}

impl BlockState {
    /// Number of states (for per-state counters).
    pub const COUNT: usize = 7;

    /// Position of the state in a per-state counter array.
    pub fn index(self) -> usize {
        match self {
            Dirty => 0,
            WritingBack => 1,
            Synced => 2,
            Evicting => 3,
            Parked => 4,
            Restoring => 5,
            Freed => 6,
        }
    }

    /// Holds an HBM slot.
    pub fn in_hbm(self) -> bool {
        matches!(self, Dirty | WritingBack | Synced | Evicting | Restoring)
    }

    /// Has a copy in flight.
    pub fn in_flight(self) -> bool {
        matches!(self, WritingBack | Evicting | Restoring)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_has_no_duplicates_and_no_exit_from_freed() {
        for (i, a) in TRANSITIONS.iter().enumerate() {
            assert!(!TRANSITIONS[i + 1..].contains(a), "duplicate {a:?}");
            assert_ne!(a.0, Freed);
        }
        assert!(!allowed(Parked, Synced));
        assert!(!allowed(Restoring, Dirty));
        assert!(allowed(Synced, Parked));
    }
}
