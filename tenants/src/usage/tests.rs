use super::*;
use crate::store::TenantStore;
use crate::NewTenant;

fn counts(requests: u64, prompt: u64, cached: u64, completion: u64, errors: u64) -> UsageCounts {
    UsageCounts {
        requests,
        sequences: requests,
        prompt_tokens: prompt,
        cached_tokens: cached,
        completion_tokens: completion,
        errors,
    }
}

#[test]
fn records_sum_per_tenant_and_hour_and_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let (a, b) = {
        let s = TenantStore::open(&path).unwrap();
        let (a, _) = s.create(NewTenant::named("a")).unwrap();
        let (b, _) = s.create(NewTenant::named("b")).unwrap();
        let u = s.usage();
        let h = 491_000 * HOUR_MS; // some hour
        assert_eq!(u.record(a.id, h + 10, counts(1, 10, 0, 5, 0)), 1);
        assert_eq!(u.record(a.id, h + HOUR_MS - 1, counts(1, 20, 16, 7, 0)), 2);
        assert_eq!(u.durable_seq(), 0, "nothing is on disk before a flush");
        u.flush().unwrap();
        assert_eq!(u.durable_seq(), 2);
        assert_eq!(u.record(a.id, h + HOUR_MS, counts(1, 3, 0, 0, 1)), 3);
        assert_eq!(u.durable_seq(), 2);
        // Two requests of three sequences (one with `n: 2`).
        u.record(
            b.id,
            h,
            UsageCounts {
                sequences: 3,
                ..counts(2, 8, 0, 4, 0)
            },
        );
        s.flush().unwrap(); // the store's flush also flushes the ledger
        assert_eq!(u.durable_seq(), 4);
        (a, b)
    };
    let s = TenantStore::open(&path).unwrap();
    s.check().unwrap();
    let rows = s.usage().rows(&UsageQuery::default()).unwrap();
    let got: Vec<(TenantId, u64, UsageCounts)> =
        rows.iter().map(|r| (r.tenant, r.hour, r.counts)).collect();
    assert_eq!(
        got,
        vec![
            (a.id, 491_000, counts(2, 30, 16, 12, 0)),
            (a.id, 491_001, counts(1, 3, 0, 0, 1)),
            (
                b.id,
                491_000,
                UsageCounts {
                    sequences: 3,
                    ..counts(2, 8, 0, 4, 0)
                }
            ),
        ]
    );
    let only_a_second_hour = UsageQuery {
        tenant: Some(a.id),
        from_hour: Some(491_001),
        to_hour: Some(491_002),
    };
    let r = s.usage_report(&only_a_second_hour).unwrap();
    assert_eq!(r.totals, counts(1, 3, 0, 0, 1));
    assert_eq!(r.data[0].tenant.as_deref(), Some("a"));
    // A deleted tenant's rows stay, without a name.
    s.delete(b.id).unwrap();
    let r = s.usage_report(&UsageQuery::default()).unwrap();
    assert_eq!(
        r.totals,
        UsageCounts {
            sequences: 6,
            ..counts(5, 41, 16, 16, 1)
        }
    );
    assert_eq!(r.data[2].tenant, None);
    let csv = to_csv(&r);
    let mut lines = csv.lines();
    assert_eq!(
        lines.next(),
        Some("tenant_id,tenant,hour,requests,sequences,prompt_tokens,cached_tokens,completion_tokens,errors")
    );
    assert_eq!(
        lines.next(),
        Some("1,a,2026-01-05T08:00:00Z,2,2,30,16,12,0")
    );
    assert_eq!(lines.nth(1), Some("2,,2026-01-05T08:00:00Z,2,3,8,0,4,0"));
}

#[test]
fn times_parse_and_format_in_utc() {
    assert_eq!(format_hour(0), "1970-01-01T00:00:00Z");
    assert_eq!(format_hour(491_000), "2026-01-05T08:00:00Z");
    assert_eq!(parse_time("from", "1767600000").unwrap(), 1_767_600_000);
    assert_eq!(
        parse_time("from", "2026-01-05T08:00:00Z").unwrap(),
        491_000 * 3600
    );
    assert_eq!(parse_time("from", "2026-01-05T08").unwrap(), 491_000 * 3600);
    assert_eq!(parse_time("from", "2024-02-29").unwrap(), 1_709_164_800);
    for bad in [
        "",
        "2026-02-30",
        "2026-13-01",
        "2026-01-05T24",
        "yesterday",
        "2026-1-5",
    ] {
        let e = parse_time("from", bad).unwrap_err().to_string();
        assert!(
            e.contains("invalid `from`") && e.contains("Unix seconds"),
            "{bad}: {e}"
        );
    }
}

#[test]
fn a_fleet_report_sums_each_ledger_once_matching_tenants_by_name() {
    let node = |ledger: &str, rows: Vec<UsageReportRow>| {
        let mut totals = UsageCounts::default();
        for r in &rows {
            totals.add(&r.counts);
        }
        UsageReport {
            ledgers: vec![ledger.to_string()],
            data: rows,
            totals,
        }
    };
    let row = |id: u32, name: Option<&str>, hour: u64, c: UsageCounts| {
        UsageReportRow::new(id, name.map(str::to_string), hour, c)
    };
    // "acme" is id 2 on one node and 3 on the other; a deleted tenant 9 is on both.
    let a = node(
        "aa",
        vec![
            row(2, Some("acme"), 10, counts(1, 5, 0, 3, 0)),
            row(2, Some("acme"), 11, counts(2, 6, 0, 4, 1)),
            row(9, None, 10, counts(1, 1, 0, 1, 0)),
        ],
    );
    let b = node(
        "bb",
        vec![
            row(3, Some("acme"), 10, counts(4, 7, 2, 8, 0)),
            row(9, None, 10, counts(1, 2, 0, 2, 0)),
        ],
    );
    let fleet = UsageReport::merge([a.clone(), b.clone()]).unwrap();
    assert_eq!(fleet.ledgers, ["aa", "bb"]);
    let mut want = a.totals;
    want.add(&b.totals);
    assert_eq!(fleet.totals, want);
    let acme10 = fleet
        .data
        .iter()
        .find(|r| r.tenant.as_deref() == Some("acme") && r.hour_unix_s == 36_000)
        .unwrap();
    assert_eq!(
        (acme10.tenant_id, acme10.counts),
        (2, counts(5, 12, 2, 11, 0))
    );
    // Deleted tenants' rows stay apart: two rows of id 9.
    assert_eq!(fleet.data.iter().filter(|r| r.tenant.is_none()).count(), 2);
    assert_eq!(fleet.data.len(), 4);
    // The same node twice is refused, naming its ledger.
    let err = UsageReport::merge([a.clone(), b, a]).unwrap_err();
    assert_eq!(err, DuplicateLedger("aa".into()));
}

/// A flush to disk that fails after its transaction was applied bills nothing twice: the
/// counts are in the tree once, the record is not durable until a later flush succeeds.
#[test]
fn a_failed_disk_flush_bills_each_record_once() {
    let dir = tempfile::tempdir().unwrap();
    let s = TenantStore::open(dir.path().join("db")).unwrap();
    let (a, _) = s.create(NewTenant::named("a")).unwrap();
    let u = s.usage();
    let h = 491_000 * HOUR_MS;
    u.record(a.id, h, counts(1, 10, 0, 5, 0));
    let failed = u.flush_with(|| Err(TenantError::Corrupt("injected fsync error".into())));
    assert!(failed.is_err());
    assert_eq!(
        u.durable_seq(),
        0,
        "not durable while the disk flush failed"
    );
    u.flush().unwrap();
    assert_eq!(u.durable_seq(), 1);
    let rows = u.rows(&UsageQuery::default()).unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].counts, counts(1, 10, 0, 5, 0), "billed once");
}
