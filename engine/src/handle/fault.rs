//! Fault injection for the tests of engine supervision; compiled only with the
//! `fault-injection` feature (a dev-dependency feature: release builds have none of it).
//!
//! `SUPERINFER_FAULT_PANIC_AT_STEP=N` makes the serving loop panic just before its `N`-th
//! step (counting from 1), as a bug in a step would: the supervision path (every request ends
//! with `engine_failed`, health turns 503, `serve` drains and exits 1) is then exercised end to
//! end through the real binary.
//!
//! `SUPERINFER_FAULT_MASK_PANIC=1` makes every grammar-mask computation panic, as a bug in
//! the grammar engine would: only the constrained requests may fail, never the engine.

/// The environment variable naming the step that panics.
pub const PANIC_AT_STEP: &str = "SUPERINFER_FAULT_PANIC_AT_STEP";

/// The environment variable that makes grammar masks panic.
pub const MASK_PANIC: &str = "SUPERINFER_FAULT_MASK_PANIC";

/// Whether grammar masks panic (read once).
pub(crate) fn mask_panics() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var(MASK_PANIC).is_ok_and(|v| v == "1"))
}

/// Counts the loop's steps and panics at the chosen one.
#[derive(Debug, Default)]
pub(super) struct Fault {
    panic_at: Option<u64>,
    steps: u64,
}

impl Fault {
    /// The fault the environment asks for (none when the variable is unset or not a number).
    pub(super) fn from_env() -> Fault {
        Fault {
            panic_at: std::env::var(PANIC_AT_STEP)
                .ok()
                .and_then(|v| v.trim().parse().ok()),
            steps: 0,
        }
    }

    /// Called before each step; panics when it is the chosen one.
    pub(super) fn before_step(&mut self) {
        self.steps += 1;
        if self.panic_at == Some(self.steps) {
            panic!("injected fault: a panic before engine step {}", self.steps);
        }
    }
}
