//! Default sizes, overridable by the agent at load; why each is what it is: the agent's `--help`
//! and BENCHMARKS.md (memory).

/// Ring buffer bytes (a power of two, a multiple of the page size). 1 MiB lost nothing at
/// 500,000-650,000 records/s from 4 producers on 2 vCPUs, 512 KiB up to 0.6 % (`xtask/x.sh
/// bench ring`): twice the smallest loss-free size. Costs twice its size in RSS (the data
/// pages are mapped twice).
pub const RING_BYTES: u32 = 2 * 1024 * 1024;
/// Entries in the per-cgroup counters map: one per cgroup with activity, freed when the
/// cgroup goes. 1,000 containers used 1,001 entries; ~400 bytes of kernel memory each.
pub const COUNTER_ENTRIES: u32 = 4 * 1024;
/// Entries in the listening-socket -> port map.
pub const LISTENER_ENTRIES: u32 = 16 * 1024;
/// Entries of that map one cgroup may hold: a pod listening on every port fills its own
/// quota, not the node's map (past it, its closes carry no port and the agent's refresh
/// closes them; others' are untouched). Twice the ports the agent keeps per container
/// (`MAX_PORTS_PER_UNIT`); filling the node's map takes 256 cgroups doing so, more than a
/// node's pods (110 by default) have containers that listen.
pub const LISTENERS_PER_CGROUP: u64 = 64;
/// Signal records one sending cgroup may cause per second in one target cgroup, on average,
/// and in a burst: a container flooding signals costs the ring this much and is counted
/// beyond it (`rate_limited`); the budget is per (sender, target) pair, so a flood never
/// pushes out the stop signals verdicts need, even one the tenant makes the runtime send
/// (`SignalBudgetKey`).
pub const SIGNAL_RECORDS_PER_SECOND: u64 = 200;
pub const SIGNAL_RECORDS_BURST: u64 = 2048;
