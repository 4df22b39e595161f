//! `superinfer`: see [`superinfer_gateway::cli`].
#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    superinfer_gateway::cli::main()
}
