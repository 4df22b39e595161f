use super::*;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/traces")
        .join(name)
}

fn lengths(f: &TraceFile) -> Vec<(u32, u32)> {
    f.rows
        .iter()
        .map(|r| (r.prompt_tokens, r.output_tokens))
        .collect()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-6
}

#[test]
fn azure_2023_rows_keep_their_order_times_and_lengths() {
    let f = read(&fixture("azure-2023.csv"), None, None).unwrap();
    assert_eq!(f.format, TraceFormat::Azure);
    assert_eq!(lengths(&f), [(374, 44), (396, 109), (879, 0)]);
    assert!(close(f.rows[0].time_s, 0.0));
    assert!(close(f.rows[1].time_s, 4.314579), "{}", f.rows[1].time_s);
    assert_eq!(f.rows[1].time_s, f.rows[2].time_s);
    assert_eq!(f.rows.iter().map(|r| r.line).collect::<Vec<_>>(), [2, 3, 4]);
    // 100 ns ticks, read exactly: the one gap is the grid.
    assert_eq!(f.rows[1].time_s, 43_145_790.0 * 1e-7);
    assert!(close(f.resolution_s, 4.314579), "{}", f.resolution_s);
    assert_eq!(f.sha256.len(), 64);
}

#[test]
fn azure_2024_timestamps_with_a_zone_are_read() {
    let f = read(&fixture("azure-2024.csv"), None, None).unwrap();
    assert_eq!(lengths(&f), [(2048, 28), (4096, 12)]);
    assert!(close(f.rows[1].time_s, 1.49007), "{}", f.rows[1].time_s);
    let utc = azure_time("2024-05-10 02:00:00+02:00").unwrap().0;
    assert!(close(utc, azure_time("2024-05-10 00:00:00").unwrap().0));
    assert!(close(
        azure_time("1970-01-02 00:00:01").unwrap().0,
        86_401.0
    ));
    for bad in [
        "2024-13-01 00:00:00",
        "yesterday",
        "2024-05-10",
        "2024-05-10 00:00:00.x",
    ] {
        assert!(azure_time(bad).is_err(), "{bad}");
    }
}

#[test]
fn mooncake_rows_carry_their_block_ids_and_the_3_s_grid() {
    let f = read(&fixture("mooncake.jsonl"), None, Some("hash_ids")).unwrap();
    assert_eq!(f.format, TraceFormat::Mooncake);
    assert_eq!(lengths(&f), [(1100, 6), (700, 4), (40, 9)]);
    assert_eq!(f.rows[0].hash_ids.as_deref(), Some(&[0, 1, 2][..]));
    assert_eq!(f.rows[1].hash_ids.as_deref(), Some(&[0, 5][..]));
    assert!(close(f.rows[2].time_s, 3.0));
    assert!(close(f.resolution_s, 3.0), "{}", f.resolution_s);
    // hash:hash_ids keys a row by its first block.
    assert_eq!(f.rows[0].key, f.rows[1].key);
    assert_ne!(f.rows[0].key, f.rows[2].key);
}

#[test]
fn burstgpt_rows_keep_failed_ones_for_the_replay_to_count() {
    let f = read(&fixture("burstgpt.csv"), None, Some("Model")).unwrap();
    assert_eq!(f.format, TraceFormat::Burstgpt);
    assert_eq!(lengths(&f), [(472, 18), (1087, 0), (31, 127)]);
    assert!(close(f.rows[2].time_s, 42.0));
    assert_eq!(f.rows[1].key.as_deref(), Some("GPT-4"));
    assert!(close(f.resolution_s, 2.0), "{}", f.resolution_s);
}

#[test]
fn own_jsonl_skips_blank_lines_and_reads_optional_fields() {
    let f = read(&fixture("own.jsonl"), None, Some("tenant")).unwrap();
    assert_eq!(f.format, TraceFormat::Jsonl);
    assert_eq!(lengths(&f), [(100, 10), (50, 5)]);
    assert_eq!(f.rows[1].line, 3);
    assert!(close(f.rows[0].time_s, 0.25) && close(f.rows[1].time_s, 0.0));
    assert_eq!(f.rows[1].hash_ids.as_deref(), Some(&[4, 4][..]));
    assert_eq!(f.rows[0].key.as_deref(), Some("gold"));
    assert_eq!(f.resolution_s, 0.0);
}

#[test]
fn bad_files_name_the_line_and_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let err = |p: &Path, key: Option<&str>| read(p, None, key).unwrap_err().to_string();
    let p = write(
        "a.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,12x,3\n",
    );
    assert!(
        err(&p, None).contains(":2: '12x' is not a token count"),
        "{}",
        err(&p, None)
    );
    let p = write(
        "b.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,1,3\n",
    );
    assert!(err(&p, Some("user")).contains("no column 'user'"));
    let p = write("c.jsonl", "{\"timestamp\": 0, \"input_length\": 5, \"output_length\": 1}\n{\"timestamp\": -4, \"input_length\": 5, \"output_length\": 1}\n");
    assert!(
        err(&p, None).contains(":2: the time must be >= 0"),
        "{}",
        err(&p, None)
    );
    let p = write("d.txt", "hello\n");
    assert!(err(&p, None).contains("unknown trace format"));
    let p = write("e.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n");
    assert!(err(&p, None).contains("no usable entries"));
    assert!(err(&dir.path().join("missing.csv"), None).contains("cannot read"));
    assert_eq!("mooncake".parse::<TraceFormat>(), Ok(TraceFormat::Mooncake));
    assert!("parquet".parse::<TraceFormat>().is_err());
}
