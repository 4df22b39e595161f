//! Run-time compilation: CUDA C to a cubin for this GPU's architecture with NVRTC, cached on
//! disk by source hash, architecture, options and compiler version (`compile_cache`).

use std::ffi::{c_char, c_int, CString};
use std::sync::Arc;
use std::time::Instant;

use super::cudarc::driver::CudaModule;
use super::cudarc::nvrtc::{result, sys, Ptx};
use super::{driver, Gpu};
use crate::compile_cache::{CacheKey, CompileCache};
use crate::error::{Error, Result};

/// How a module was obtained.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Origin {
    /// Read from the cache.
    Cached,
    /// Compiled now, taking this many milliseconds, and stored.
    Compiled { ms: f64 },
}

/// NVRTC's version, e.g. "13.0".
pub fn compiler_version() -> Result<String> {
    let (mut major, mut minor): (c_int, c_int) = (0, 0);
    // SAFETY: nvrtcVersion writes two ints through valid pointers.
    let r = unsafe { sys::nvrtcVersion(&mut major, &mut minor) };
    r.result().map_err(|e| Error::Cuda {
        op: "nvrtcVersion",
        detail: format!("{e:?}"),
    })?;
    Ok(format!("{major}.{minor}"))
}

/// Compiles `source` to a cubin for `arch` (e.g. `sm_90`).
pub fn compile_cubin(name: &str, source: &str, arch: &str, options: &[String]) -> Result<Vec<u8>> {
    let nvrtc = |op: &'static str| {
        move |e: result::NvrtcError| Error::Cuda {
            op,
            detail: format!("{e:?}"),
        }
    };
    let src =
        CString::new(source).map_err(|_| Error::Invalid("kernel source holds a NUL".into()))?;
    let cname = CString::new(name).map_err(|_| Error::Invalid("kernel name holds a NUL".into()))?;
    let prog = result::create_program(&src, Some(&cname)).map_err(nvrtc("nvrtcCreateProgram"))?;
    let mut opts = vec![format!("--gpu-architecture={arch}")];
    opts.extend(options.iter().cloned());
    // SAFETY: `prog` is a live program; the options are valid strings.
    let compiled = unsafe { result::compile_program(prog, &opts) };
    let out = match compiled {
        Err(e) => {
            // SAFETY: `prog` is live; the log is a NUL-terminated buffer we own.
            let log = unsafe { result::get_program_log(prog) }
                .map(|l| l.iter().map(|&c| c as u8 as char).collect::<String>())
                .unwrap_or_default();
            Err(Error::Compile {
                module: name.into(),
                log: format!("{e:?}: {log}"),
            })
        }
        Ok(()) => {
            let mut size = 0usize;
            // SAFETY: `prog` compiled successfully for a real architecture, so it has a
            // cubin; the first call writes its size, the second fills a buffer of that size.
            unsafe { sys::nvrtcGetCUBINSize(prog, &mut size) }
                .result()
                .map_err(nvrtc("nvrtcGetCUBINSize"))
                .and_then(|()| {
                    let mut cubin = vec![0u8; size];
                    // SAFETY: see above; `cubin` holds `size` bytes.
                    unsafe { sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr() as *mut c_char) }
                        .result()
                        .map_err(nvrtc("nvrtcGetCUBIN"))
                        .map(|()| cubin)
                })
        }
    };
    // SAFETY: `prog` is destroyed once, after its last use.
    unsafe { result::destroy_program(prog) }.map_err(nvrtc("nvrtcDestroyProgram"))?;
    out
}

/// Loads a module for `gpu`, from the cache if it holds this exact build, else compiling and
/// storing it. A cache that cannot be written is not an error (the module still loads).
pub fn load_module(
    gpu: &Gpu,
    cache: &CompileCache,
    name: &str,
    source: &str,
    options: &[String],
) -> Result<(Arc<CudaModule>, Origin)> {
    let arch = gpu.arch()?;
    let compiler = compiler_version()?;
    let key = CacheKey {
        name,
        source,
        arch: &arch,
        options,
        compiler: &compiler,
    };
    let (cubin, origin) = match cache.get(&key) {
        Some(bin) => (bin, Origin::Cached),
        None => {
            let t = Instant::now();
            let bin = compile_cubin(name, source, &arch, options)?;
            let ms = t.elapsed().as_secs_f64() * 1e3;
            if let Err(e) = cache.put(&key, &bin) {
                eprintln!(
                    "kernel cache {}: {e} (continuing without it)",
                    cache.dir().display()
                );
            }
            (bin, Origin::Compiled { ms })
        }
    };
    let module = gpu
        .context()
        .load_module(Ptx::from_binary(cubin))
        .map_err(driver("cuModuleLoadData"))?;
    Ok((module, origin))
}
