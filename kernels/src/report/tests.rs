use super::*;

fn row(name: &str, mode: Mode, total_ms: f64) -> Row {
    Row {
        name: name.into(),
        mode,
        copies: (2048, 2048),
        calls: (1, 1),
        bytes: 8 << 30,
        total_ms,
        dir_ms: (total_ms, total_ms),
        verified: Verified::Ok,
    }
}

#[test]
fn gbps_is_decimal() {
    assert!((gbps(1_000_000_000, 1000.0) - 1.0).abs() < 1e-12);
    assert!((gbps(8 << 30, 178.6) - 48.1).abs() < 0.05);
    assert_eq!(gbps(1, 0.0), 0.0);
}

#[test]
fn median_of_odd_and_even() {
    assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
    assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
    assert!(median(&[]).is_nan());
}

#[test]
fn fractions_use_the_rows_mode() {
    let c = Ceilings {
        sequential_ms: 300.0,
        duplex_ms: 180.0,
    };
    let seq = row("merged", Mode::Sequential, 330.0);
    let dup = row("duplex", Mode::Duplex, 200.0);
    assert!((c.of_same_mode(&seq) - 300.0 / 330.0).abs() < 1e-12);
    assert!((c.of_duplex(&seq) - 180.0 / 330.0).abs() < 1e-12);
    assert!((c.of_same_mode(&dup) - 0.9).abs() < 1e-12);
}

#[test]
fn table_has_a_line_per_row_and_flags_bad_data() {
    let c = Ceilings {
        sequential_ms: 300.0,
        duplex_ms: 180.0,
    };
    let mut bad = row("naive", Mode::Sequential, 3000.0);
    bad.verified = Verified::Mismatch(12);
    bad.copies = (262_144, 262_144);
    bad.calls = bad.copies;
    let t = table(&[bad, row("duplex", Mode::Duplex, 180.0)], &c);
    assert_eq!(t.lines().count(), 4);
    assert!(t.contains("| naive | 262144 (262144) | 32 KiB | 3000.0 |"));
    assert!(t.contains("**12 words wrong**"));
    assert!(t.contains("| 100% | 100% | verified |"));
}

#[test]
fn interference_slowdown() {
    let r = Interference {
        name: "copy".into(),
        alone_ms: 100.0,
        together_ms: 125.0,
    };
    assert!((r.slowdown() - 1.25).abs() < 1e-12);
    assert!(interference_table(&[r]).contains("| copy | 100.0 | 125.0 | 1.25x |"));
}
