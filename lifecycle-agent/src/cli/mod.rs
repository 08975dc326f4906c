//! The client side of the subcommands that talk to a running agent.

pub mod explain;
pub mod status;
