//! The client side of the subcommands that talk to a running agent, and `doctor`, the preflight
//! that checks a node before the agent runs there.

pub mod doctor;
pub mod plugin;
pub mod status;
