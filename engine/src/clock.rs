//! Engine time. The engine never sleeps; it asks a [`Clock`] what time it is and tells it how
//! long a step took, so the same engine runs on the wall clock (serving) or on a virtual clock
//! (the simulated twin).

use std::time::Instant;

/// A source of engine time in seconds since the clock's epoch.
pub trait Clock: Send {
    /// Seconds since this clock's epoch.
    fn now(&self) -> f64;
    /// A model step just took `elapsed` seconds. A real clock ignores it (the time has
    /// passed); a virtual clock moves forward by it.
    fn advance(&mut self, elapsed: f64);
    /// Nothing to do until engine time `t`: a virtual clock jumps there; a real clock does
    /// nothing (the caller waits on its inbox instead).
    fn skip_to(&mut self, t: f64);
}

/// Wall-clock time from a monotonic [`Instant`].
#[derive(Clone, Debug)]
pub struct RealClock {
    epoch: Instant,
}

impl RealClock {
    pub fn new() -> RealClock {
        RealClock {
            epoch: Instant::now(),
        }
    }
}

impl Default for RealClock {
    fn default() -> Self {
        RealClock::new()
    }
}

impl Clock for RealClock {
    fn now(&self) -> f64 {
        self.epoch.elapsed().as_secs_f64()
    }

    fn advance(&mut self, _elapsed: f64) {}

    fn skip_to(&mut self, _t: f64) {}
}

/// Simulated time: moves only when told to.
#[derive(Clone, Debug, Default)]
pub struct VirtualClock {
    now: f64,
}

impl VirtualClock {
    pub fn new() -> VirtualClock {
        VirtualClock { now: 0.0 }
    }
}

impl Clock for VirtualClock {
    fn now(&self) -> f64 {
        self.now
    }

    fn advance(&mut self, elapsed: f64) {
        self.now += elapsed.max(0.0);
    }

    fn skip_to(&mut self, t: f64) {
        if t > self.now {
            self.now = t;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn virtual_clock_moves_only_forward() {
        let mut c = VirtualClock::new();
        c.advance(0.5);
        c.skip_to(0.25);
        assert_eq!(c.now(), 0.5);
        c.skip_to(2.0);
        c.advance(-1.0);
        assert_eq!(c.now(), 2.0);
    }

    #[test]
    fn real_clock_is_monotonic() {
        let c = RealClock::new();
        let a = c.now();
        let b = c.now();
        assert!(b >= a);
    }
}
