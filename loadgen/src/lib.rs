//! SuperInfer load generator (under construction).
#![forbid(unsafe_code)]
