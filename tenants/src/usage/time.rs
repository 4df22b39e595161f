//! UTC times for the ledger's hour buckets without a date crate: civil dates ↔ days since the
//! epoch (Howard Hinnant's `days_from_civil` / `civil_from_days`, exact for the proleptic
//! Gregorian calendar).

use crate::error::{Result, TenantError};

/// `2026-12-01T19:00:00Z` for the hour bucket `hour` (hours since the epoch).
pub fn format_hour(hour: u64) -> String {
    let days = i64::try_from(hour / 24).unwrap_or(i64::MAX);
    let (y, m, d) = civil_from_days(days);
    format!("{y:04}-{m:02}-{d:02}T{:02}:00:00Z", hour % 24)
}

/// Seconds since the epoch of `s`: Unix seconds (all digits), or a UTC time
/// `YYYY-MM-DD[THH[:MM[:SS]]][Z]`. `what` names the parameter in the error.
pub fn parse_time(what: &'static str, s: &str) -> Result<u64> {
    let bad = || {
        TenantError::invalid(
            what,
            format!(
                "`{s}` is not a time: give Unix seconds or a UTC time like 2026-12-01T19:00:00Z"
            ),
        )
    };
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        return s.parse().map_err(|_| bad());
    }
    let t = s.strip_suffix('Z').unwrap_or(s);
    let (date, clock) = t.split_once('T').unwrap_or((t, ""));
    let mut ymd = date.split('-');
    let num = |p: Option<&str>, len: usize| -> Result<i64> {
        match p {
            Some(p) if p.len() == len && p.bytes().all(|b| b.is_ascii_digit()) => {
                p.parse().map_err(|_| bad())
            }
            _ => Err(bad()),
        }
    };
    let (y, m, d) = (
        num(ymd.next(), 4)?,
        num(ymd.next(), 2)?,
        num(ymd.next(), 2)?,
    );
    if ymd.next().is_some() || !(1..=12).contains(&m) || !(1..=31).contains(&d) {
        return Err(bad());
    }
    let mut hms = [0i64; 3];
    if !clock.is_empty() {
        let parts: Vec<&str> = clock.split(':').collect();
        if parts.len() > 3 {
            return Err(bad());
        }
        for (slot, p) in hms.iter_mut().zip(&parts) {
            *slot = num(Some(p), 2)?;
        }
    }
    if hms[0] > 23 || hms[1] > 59 || hms[2] > 59 {
        return Err(bad());
    }
    let days = days_from_civil(y, m, d);
    if civil_from_days(days) != (y, m, d) {
        return Err(bad()); // e.g. February 30th
    }
    let secs = days * 86_400 + hms[0] * 3600 + hms[1] * 60 + hms[2];
    u64::try_from(secs).map_err(|_| bad())
}

fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (
        if m <= 2 {
            yoe + era * 400 + 1
        } else {
            yoe + era * 400
        },
        m,
        d,
    )
}
