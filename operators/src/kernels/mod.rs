//! Pure kernels: functions on Arrow buffers, tested against plain reference
//! definitions, with no knowledge of pipelines or dataflows.

pub mod categorical;
pub mod log1p;
pub mod numeric;
