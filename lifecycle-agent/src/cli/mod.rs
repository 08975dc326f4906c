//! `doctor`, the preflight that checks a node before the agent runs there. The client side of
//! `status` and `explain` is the `lifecycle-cli` crate, shared with the kubectl plugin.

pub mod doctor;
