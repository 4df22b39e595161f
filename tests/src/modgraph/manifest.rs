//! The workspace's crates, read from the manifests: each member's library root and the
//! binary roots, with the external crate names their code may use.
//!
//! The manifests are read line by line (sections, keys and the `members` array), which is
//! all this needs from them.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

/// A crate to analyze.
#[derive(Debug)]
pub(crate) struct CrateRoot {
    /// The package name for a library; `<package>/bin/<name>` for a binary.
    pub name: String,
    /// Its root file.
    pub root: PathBuf,
    pub binary: bool,
    /// The names of the external crates it may use.
    pub externs: BTreeSet<String>,
}

/// The crates of the workspace whose root manifest is in `workspace`, in member order.
pub(crate) fn crate_roots(workspace: &Path) -> Result<Vec<CrateRoot>, String> {
    let read = |p: &Path| fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()));
    let mut out = Vec::new();
    for member in members(&read(&workspace.join("Cargo.toml"))?) {
        let dir = workspace.join(&member);
        let manifest = read(&dir.join("Cargo.toml"))?;
        let package =
            package_name(&manifest).ok_or_else(|| format!("{member}: no package name"))?;
        let lib_name = package.replace('-', "_");
        let mut externs = dependency_names(&manifest);
        externs.extend(["std", "core", "alloc", "proc_macro", "test"].map(String::from));
        let lib = dir.join("src/lib.rs");
        if lib.is_file() {
            out.push(CrateRoot {
                name: package.clone(),
                root: lib,
                binary: false,
                externs: externs.clone(),
            });
        }
        // A binary may use the package's library by name.
        externs.insert(lib_name);
        for (bin, root) in binary_roots(&dir, &package) {
            out.push(CrateRoot {
                name: format!("{package}/bin/{bin}"),
                root,
                binary: true,
                externs: externs.clone(),
            });
        }
    }
    Ok(out)
}

/// The binary roots of the package in `dir` by Cargo's conventions: `src/main.rs`,
/// `src/bin/*.rs` and `src/bin/*/main.rs`, with their names.
fn binary_roots(dir: &Path, package: &str) -> Vec<(String, PathBuf)> {
    let mut out = Vec::new();
    let main = dir.join("src/main.rs");
    if main.is_file() {
        out.push((package.to_string(), main));
    }
    let mut entries: Vec<PathBuf> = fs::read_dir(dir.join("src/bin"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .collect();
    entries.sort();
    for path in entries {
        let Some(stem) = path
            .file_stem()
            .and_then(|s| s.to_str())
            .map(str::to_string)
        else {
            continue;
        };
        if path.extension().is_some_and(|e| e == "rs") && path.is_file() {
            out.push((stem, path));
        } else if path.join("main.rs").is_file() {
            out.push((stem, path.join("main.rs")));
        }
    }
    out
}

/// The entries of the `members` array of a workspace manifest.
fn members(manifest: &str) -> Vec<String> {
    let Some(start) = manifest.find("members") else {
        return Vec::new();
    };
    let rest = &manifest[start..];
    let (Some(open), Some(close)) = (rest.find('['), rest.find(']')) else {
        return Vec::new();
    };
    rest[open + 1..close]
        .split(',')
        .map(|m| m.trim().trim_matches('"').to_string())
        .filter(|m| !m.is_empty())
        .collect()
}

/// The `name` of a manifest's `[package]` section.
fn package_name(manifest: &str) -> Option<String> {
    let mut section = String::new();
    for line in manifest.lines().map(str::trim) {
        if let Some(s) = section_name(line) {
            section = s;
        } else if section == "package" {
            if let Some((key, value)) = line.split_once('=') {
                if key.trim() == "name" {
                    return Some(value.trim().trim_matches('"').to_string());
                }
            }
        }
    }
    None
}

/// The names (as code spells them: `-` as `_`) of all the dependencies a manifest declares,
/// normal, dev, build and target-specific.
fn dependency_names(manifest: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut in_deps = false;
    for line in manifest.lines().map(str::trim) {
        if let Some(section) = section_name(line) {
            in_deps = false;
            let parts: Vec<&str> = section.split('.').collect();
            let is_deps = |p: &str| p.ends_with("dependencies");
            if parts.last().is_some_and(|p| is_deps(p)) {
                in_deps = true;
            } else if parts.len() >= 2 && is_deps(parts[parts.len() - 2]) {
                // `[dependencies.name]`
                names.insert(parts[parts.len() - 1].replace('-', "_"));
            }
        } else if in_deps && !line.starts_with('#') {
            if let Some((key, _)) = line.split_once('=') {
                let key = key
                    .split('.')
                    .next()
                    .unwrap_or_default()
                    .trim()
                    .trim_matches('"');
                if !key.is_empty() {
                    names.insert(key.replace('-', "_"));
                }
            }
        }
    }
    names
}

/// `Some(name)` when `line` is a `[name]` section header.
fn section_name(line: &str) -> Option<String> {
    let inner = line.strip_prefix('[')?.split(']').next()?;
    Some(inner.trim_matches('[').trim().to_string())
}
