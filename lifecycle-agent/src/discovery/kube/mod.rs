//! The Kubernetes API as the source of each pod's spec and reported status (see `convert.rs`
//! for the decoding, `watch.rs` for the watches).

pub mod convert;
