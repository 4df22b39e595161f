//! Model code: [`tiny`] writes the embedded random-weight default model (its text is
//! meaningless).

pub mod tiny;
