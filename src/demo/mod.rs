//! Demo code, apart from the core: a generator of Criteo-like data and a small
//! data-parallel logistic regression that trains on the loaders' batches.

mod generate;
mod train;

pub use generate::{ROW_GROUP, criteo, criteo_with_row_groups};
pub use train::{TrainConfig, TrainReport, train};
