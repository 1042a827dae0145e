//! Demo code, apart from the core: a generator of Criteo-like data and a small
//! data-parallel logistic regression that trains on the loaders' batches.

mod generate;
mod train;

pub use generate::criteo;
pub use train::{TrainConfig, TrainReport, train};
