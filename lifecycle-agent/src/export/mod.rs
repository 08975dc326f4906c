//! Export: the model's read-only view turned into Prometheus series and JSON. Label spellings,
//! histograms and bucket bounds live here, not in the model.

pub mod histogram;
pub mod labels;
pub mod metrics;
mod unit_text;
pub mod units;
