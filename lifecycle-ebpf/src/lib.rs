//! Library face of the kernel crate: empty. It exists so the agent can list this crate as a
//! build dependency (cargo then rebuilds the agent when the kernel programs change); the programs
//! themselves are the `lifecycle` binary in main.rs, built for the bpf target by aya-build.
#![no_std]
