//! Parsers of the flags' numbers, each with a message that says what a valid value is, and
//! the error of a bad combination of flags.

use crate::error::Error;

/// A bad combination of flags (exit status 2).
pub(crate) fn usage(msg: String) -> Error {
    Error::Usage(msg)
}

pub(crate) fn parse_positive(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        Ok(v) => Err(format!("must be positive and finite, got {v}")),
        Err(_) => Err(format!("'{s}' is not a number")),
    }
}

pub(crate) fn parse_non_negative(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        Ok(v) => Err(format!("must be >= 0 and finite, got {v}")),
        Err(_) => Err(format!("'{s}' is not a number")),
    }
}

pub(crate) fn parse_fraction(s: &str) -> Result<f64, String> {
    match parse_positive(s)? {
        v if v <= 1.0 => Ok(v),
        v => Err(format!("must be in (0, 1], got {v}")),
    }
}

pub(crate) fn parse_rps(s: &str) -> Result<f64, String> {
    parse_positive(s)
        .map_err(|e| format!("offered load {e} (use a comma-separated list like 5,10,15)"))
}
