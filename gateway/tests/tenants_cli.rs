//! The offline `superinfer tenants …` commands and the data directory, run as a process: a
//! directory without a tenant store is an error for every command that only reads or changes
//! tenants (a mistyped `--data-dir` must not answer an empty list and leave a new store
//! behind), while `create` and `apply` make the store and say so.

use std::path::Path;
use std::process::{Command, Output};

fn tenants(args: &[&str], data_dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_superinfer"))
        .arg("tenants")
        .args(args)
        .arg("--data-dir")
        .arg(data_dir)
        .env_remove("SUPERINFER_DATA_DIR")
        .output()
        .expect("the superinfer binary runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

const READERS: [&[&str]; 6] = [
    &["list"],
    &["get", "acme"],
    &["patch", "acme", "--weight", "2"],
    &["rotate-key", "acme"],
    &["usage"],
    &["delete", "acme"],
];

#[test]
fn commands_that_only_read_or_change_tenants_refuse_a_directory_without_a_store() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let typo = dir.path().join("superinfer-dta");
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).expect("the directory is made");
    for args in READERS {
        for (data_dir, what) in [(&typo, "does not exist"), (&empty, "holds no tenant store")] {
            let out = tenants(args, data_dir);
            let err = stderr(&out);
            assert_eq!(
                out.status.code(),
                Some(1),
                "{args:?} in {data_dir:?}: {err}"
            );
            assert!(
                err.contains(what) && err.contains("--data-dir"),
                "{args:?}: {err}"
            );
            assert!(out.stdout.is_empty(), "{args:?}");
        }
    }
    assert!(!typo.exists(), "nothing was created at the mistyped path");
    let left: Vec<_> = std::fs::read_dir(&empty).unwrap().collect();
    assert!(
        left.is_empty(),
        "nothing was created in the empty directory: {left:?}"
    );
}

#[test]
fn create_and_apply_make_the_store_and_say_so_then_the_others_find_it() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let created = dir.path().join("created");
    let out = tenants(&["create", "acme", "--weight", "2"], &created);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("created a new tenant store"),
        "{}",
        stderr(&out)
    );
    let again = tenants(&["create", "beta"], &created);
    assert!(again.status.success(), "{}", stderr(&again));
    assert!(!stderr(&again).contains("created a new tenant store"));
    for args in READERS {
        let out = tenants(args, &created);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    }
    let list = tenants(&["list"], &created);
    let names = String::from_utf8_lossy(&list.stdout);
    assert!(
        names.contains("\"beta\"") && !names.contains("\"acme\""),
        "acme was deleted: {names}"
    );

    let applied = dir.path().join("applied");
    let file = dir.path().join("tenants.toml");
    let hash = "ab".repeat(32);
    std::fs::write(
        &file,
        format!("[[tenant]]\nname = \"gamma\"\napi_key_sha256 = \"{hash}\"\n"),
    )
    .expect("the file is written");
    let out = tenants(&["apply", "-f", file.to_str().unwrap()], &applied);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("created a new tenant store"),
        "{}",
        stderr(&out)
    );
    let list = tenants(&["list"], &applied);
    assert!(String::from_utf8_lossy(&list.stdout).contains("\"gamma\""));
}
