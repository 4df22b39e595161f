//! `superinfer-loadgen`: see [`superinfer_loadgen::cli`].
#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    superinfer_loadgen::cli::main()
}
