//! Export: the model's read-only view turned into Prometheus series, JSON and words (`explain`'s
//! verdicts and timelines, also written as the verdict log). Histograms and bucket bounds live
//! here, not in the model; label values are the model's enums' `as_str` (one spelling, which serde
//! writes too).

pub(crate) mod explain_html;
pub mod families;
pub(crate) mod histogram;
pub mod metrics;
mod unit_text;
pub mod units;
