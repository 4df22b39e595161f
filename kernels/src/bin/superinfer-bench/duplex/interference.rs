//! The duplex batch beside a memory-bound kernel on the compute stream.

use superinfer_kernels::cuda::{DeviceArena, Kernels};
use superinfer_kernels::plan::Layout;
use superinfer_kernels::report::{self, median, Interference};
use superinfer_kernels::Result;

use super::bench::{cuda, elapsed, kv_shape, Bench, Sets, GIB};

/// The duplex batch beside a memory-bound copy kernel on the compute stream: each timed alone
/// and together. Returns the rows and whether the copied data verified.
pub(super) fn interference(
    b: &mut Bench,
    sets: &Sets,
    reps: usize,
) -> Result<(Vec<Interference>, bool)> {
    let bytes = 2 * GIB;
    let src = DeviceArena::new(&b.gpu, bytes)?;
    let dst = DeviceArena::new(&b.gpu, bytes)?;
    let compute = b.gpu.compute_stream().clone();
    let ev = b.events(3)?;
    let passes = |kernels: &Kernels, k: usize| -> Result<()> {
        for _ in 0..k {
            kernels.stream_copy(&compute, &src, &dst, bytes)?;
        }
        Ok(())
    };
    passes(&b.kernels, 3)?;
    ev[0].record(&compute).map_err(cuda("cuEventRecord"))?;
    passes(&b.kernels, 10)?;
    ev[1].record(&compute).map_err(cuda("cuEventRecord"))?;
    let per_pass = elapsed(&ev[0], &ev[1])? / 10.0;
    println!(
        "  load kernel: {:.2} ms per pass over 2 GiB ({:.0} GB/s read+write)",
        per_pass,
        2.0 * report::gbps(bytes, per_pass)
    );

    b.prepare(sets, Layout::BlockFirst, kv_shape())?;
    let mut d_alone = Vec::new();
    for rep in 0..=reps {
        let s = b.engine_batch(sets, None)?;
        if rep > 0 {
            d_alone.push(s.0);
        }
    }
    let d_alone = median(&d_alone);
    let k = ((1.25 * d_alone / per_pass).ceil() as usize).max(1);
    let mut k_alone = Vec::new();
    for _ in 0..reps {
        ev[0].record(&compute).map_err(cuda("cuEventRecord"))?;
        passes(&b.kernels, k)?;
        ev[1].record(&compute).map_err(cuda("cuEventRecord"))?;
        k_alone.push(elapsed(&ev[0], &ev[1])?);
    }
    let (mut k_tog, mut d_tog) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        ev[0].record(&compute).map_err(cuda("cuEventRecord"))?;
        passes(&b.kernels, k)?;
        ev[2].record(&compute).map_err(cuda("cuEventRecord"))?;
        let s = b.engine_batch(sets, Some(&ev[0]))?;
        k_tog.push(elapsed(&ev[0], &ev[2])?);
        d_tog.push(s.0);
    }
    let bad = b.verify(sets, Layout::BlockFirst, kv_shape())?;
    println!(
        "  {k} passes; copied data {}",
        if bad == 0 {
            "verified".to_string()
        } else {
            format!("{bad} WORDS WRONG")
        }
    );
    Ok((
        vec![
            Interference {
                name: format!(
                    "DuplexKV batch ({} GiB each way)",
                    b.n as u64 * b.block_bytes / GIB
                ),
                alone_ms: d_alone,
                together_ms: median(&d_tog),
            },
            Interference {
                name: format!("memory-bound copy kernel, {k} passes over 2 GiB"),
                alone_ms: median(&k_alone),
                together_ms: median(&k_tog),
            },
        ],
        bad == 0,
    ))
}
