//! What both of lifecycle's clients share — `lifecycle-agent status|explain` on a node and the
//! `kubectl lifecycle` plugin anywhere — with nothing Linux-only, so the plugin builds for the
//! laptops kubectl runs on (macOS, Windows; the checks tier type-checks both):
//! - [`args`]: the flags both binaries take, defined once;
//! - [`table`]: the `status` table (and JSON, YAML) from the agents' answers, read through the
//!   API's types (`lifecycle_model::wire`);
//! - [`agent`]: asking one agent directly, with a deadline, host names resolved, and its own
//!   words (and a hint) when it refuses;
//! - [`text`]: what an agent says, made safe for a terminal.

pub mod agent;
pub mod args;
pub mod table;
pub mod text;
