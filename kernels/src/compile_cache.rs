//! The on-disk cache of compiled kernels: one file per (kernel source, target architecture,
//! compiler options, compiler version), so a changed source or a new GPU never loads a stale
//! binary, and an unchanged one skips NVRTC (hundreds of milliseconds per module). Plain Rust
//! file handling; the compile itself is in `cuda::nvrtc`.

#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};

use crate::pattern::fnv1a64;

/// What identifies one compiled binary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheKey<'a> {
    /// Module name, for humans reading the cache folder.
    pub name: &'a str,
    pub source: &'a str,
    /// Target, e.g. `sm_90`.
    pub arch: &'a str,
    pub options: &'a [String],
    /// Compiler version, e.g. `13.0`.
    pub compiler: &'a str,
}

impl CacheKey<'_> {
    /// A stable 64-bit hash of everything but the name.
    pub fn hash(&self) -> u64 {
        let mut text = String::with_capacity(self.source.len() + 64);
        text.push_str(self.arch);
        text.push('\0');
        text.push_str(self.compiler);
        text.push('\0');
        for o in self.options {
            text.push_str(o);
            text.push('\0');
        }
        text.push_str(self.source);
        fnv1a64(text.as_bytes())
    }

    /// The file name of the cached binary.
    pub fn file_name(&self) -> String {
        let name: String = self
            .name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        format!("{name}-{}-{:016x}.cubin", self.arch, self.hash())
    }
}

/// A folder of cached binaries.
#[derive(Clone, Debug)]
pub struct CompileCache {
    dir: PathBuf,
}

impl CompileCache {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// `$SUPERINFER_KERNEL_CACHE`, else `$XDG_CACHE_HOME/superinfer/kernels`, else
    /// `$HOME/.cache/superinfer/kernels`, else a folder under the system temp dir.
    pub fn default_dir() -> PathBuf {
        if let Some(d) = std::env::var_os("SUPERINFER_KERNEL_CACHE") {
            return PathBuf::from(d);
        }
        if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
            return Path::new(&d).join("superinfer/kernels");
        }
        if let Some(d) = std::env::var_os("HOME") {
            return Path::new(&d).join(".cache/superinfer/kernels");
        }
        std::env::temp_dir().join("superinfer-kernels")
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn path(&self, key: &CacheKey<'_>) -> PathBuf {
        self.dir.join(key.file_name())
    }

    /// The cached binary, if present and non-empty.
    pub fn get(&self, key: &CacheKey<'_>) -> Option<Vec<u8>> {
        std::fs::read(self.path(key)).ok().filter(|b| !b.is_empty())
    }

    /// Stores a binary atomically (write to a temporary name, then rename), so a reader never
    /// sees half a file even with two processes compiling at once.
    pub fn put(&self, key: &CacheKey<'_>, binary: &[u8]) -> std::io::Result<PathBuf> {
        std::fs::create_dir_all(&self.dir)?;
        let path = self.path(key);
        let tmp = self
            .dir
            .join(format!(".{}.{}.tmp", key.file_name(), std::process::id()));
        std::fs::write(&tmp, binary)?;
        std::fs::rename(&tmp, &path)?;
        Ok(path)
    }
}
