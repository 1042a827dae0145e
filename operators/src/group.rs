//! How a pipeline names its features: groups of input columns sharing a chain of steps,
//! each assembled into one tensor column, and the label.

use serde::{Deserialize, Serialize};

use crate::step::Step;

/// The tensor a group is assembled into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GroupKind {
    /// `FixedSizeList<Float32, D>`: one or more floats per column (one_hot adds `n`).
    Dense,
    /// `FixedSizeList<Int64, K>`: one integer id per column.
    Ids,
}

/// A named feature group: columns, in tensor order, and the steps applied to each.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FeatureGroup {
    /// The output column's name.
    pub name: String,
    /// What tensor it becomes.
    pub kind: GroupKind,
    /// Input columns, in the order they appear in the tensor.
    pub columns: Vec<String>,
    /// The chain applied to every column (each column is fitted separately).
    #[serde(default)]
    pub steps: Vec<Step>,
}

/// The label's output type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LabelType {
    /// Float32 (binary and regression targets).
    #[default]
    Float32,
    /// Int64 (class indices).
    Int64,
}

impl LabelType {
    /// The Arrow type labels are delivered as.
    pub fn data_type(self) -> arrow::datatypes::DataType {
        match self {
            LabelType::Float32 => arrow::datatypes::DataType::Float32,
            LabelType::Int64 => arrow::datatypes::DataType::Int64,
        }
    }
}

/// Which column is the label and what type it is delivered as.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LabelSpec {
    /// Input column.
    pub column: String,
    /// Output type.
    #[serde(default, rename = "type")]
    pub dtype: LabelType,
}

impl FeatureGroup {
    /// A group from its parts (for pipelines built in code).
    pub fn new(name: &str, kind: GroupKind, columns: &[&str], steps: Vec<Step>) -> Self {
        FeatureGroup {
            name: name.to_string(),
            kind,
            columns: columns.iter().map(|c| c.to_string()).collect(),
            steps,
        }
    }
}
