//! `superinfer`: see [`superinfer_gateway::cli`].
#![forbid(unsafe_code)]

// Many small allocations per request (headers, JSON, channels): mimalloc is measurably
// faster than the system allocator here (docs/BENCHMARKS.md, Gateway).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    superinfer_gateway::cli::main()
}
