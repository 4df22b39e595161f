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
    /// A reference to a prefix-cache entry whose HBM copy this request uses (in place, shared
    /// with any other request holding it). Immutable: nothing writes into it.
    Shared,
    /// A reference to a prefix-cache entry while the request is out of HBM: it keeps the
    /// entry (and its DRAM copy) alive for the restore.
    SharedOut,
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
    // Prefix cache: a full block turns into a cache entry once its mirror is synced (its
    // slots move to the entry, the block references it); a request rotating out keeps its
    // reference but not the HBM copy; rotating in it uses the entry's HBM copy in place, or
    // copies the entry in from DRAM (a shared restore lands as Shared).
    (Synced, Shared),
    (Shared, SharedOut),
    (SharedOut, Shared),
    (SharedOut, Restoring),
    (Restoring, Shared),
    (Shared, Freed),
    (SharedOut, Freed),
    // Finish, abort or recompute: any live state may be released (in-flight slots are
    // quarantined until their copy lands).
    (Dirty, Freed),
    (WritingBack, Freed),
    (Synced, Freed),
    (Evicting, Freed),
    (Parked, Freed),
    (Restoring, Freed),
];

/// The states a block may be created in: a fresh slot (`Dirty`), or a prefix-cache hit
/// (`SharedOut`, then held like a restore: in place or copied in from DRAM).
pub const BORN: &[BlockState] = &[Dirty, SharedOut];

/// Whether `from -> to` is in [`TRANSITIONS`].
pub fn allowed(from: BlockState, to: BlockState) -> bool {
    TRANSITIONS.iter().any(|&(f, t)| f == from && t == to)
}

impl BlockState {
    /// Number of states (for per-state counters).
    pub const COUNT: usize = 9;

    /// Position of the state in a per-state counter array.
    pub fn index(self) -> usize {
        match self {
            Dirty => 0,
            WritingBack => 1,
            Synced => 2,
            Evicting => 3,
            Parked => 4,
            Restoring => 5,
            Shared => 6,
            SharedOut => 7,
            Freed => 8,
        }
    }

    /// Holds an HBM slot.
    pub fn in_hbm(self) -> bool {
        matches!(
            self,
            Dirty | WritingBack | Synced | Evicting | Restoring | Shared
        )
    }

    /// References a prefix-cache entry (which owns the slots).
    pub fn is_shared(self) -> bool {
        matches!(self, Shared | SharedOut)
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
        // Shared blocks are immutable: never dirty again, never evicted by a copy.
        assert!(!allowed(Shared, Dirty));
        assert!(!allowed(Shared, Evicting));
        assert!(!allowed(SharedOut, Parked));
    }
}
