//! SuperInfer engine (under construction).
#![forbid(unsafe_code)]
