//! Exec-free, connection-free probes for the kubelet (issue 4).
//!
//! exec probes fork `runc exec` plus a command every period; tcpSocket probes pass even when the
//! app stopped accepting, because the kernel completes the handshake into the backlog. The agent
//! already sees listeners, handshakes, accepts and processes from the kernel, so it answers
//! probes from that: a `GET` costs a lock and a comparison, and sees a stalled accept loop.
//!
//! Layers:
//! - the facts, kept by the node model from the same kernel events as everything else
//!   (`lifecycle-model/src/node/probed.rs`): accept progress per port of each watched netns, the
//!   main process's state; published per container on its feed ([`feeds`]) by the model's owner.
//! - [`container`]: who a probe speaks for — the model's key (pod uid, container name), which
//!   everything here is kept by, and the names beside it for labels, logs and routing.
//! - [`check`] (pure): probe URLs -> [`check::CheckSpec`]; facts + time -> [`check::Verdict`].
//! - [`tcp`] (pure): a port's accept facts -> verdict, with exact deadlines for stall detection.
//! - `discovery::proc` and `discovery::sockdiag` (plumbing) sample listeners, drop counters,
//!   process state, and files read with `openat2(RESOLVE_IN_ROOT)` inside the container's root.
//! - [`pod`]: one container's declared checks, answered from the model's facts and the files it
//!   read; its refresher samples /proc for the model and re-judges when the facts change.
//! - [`files`]: the declared files, read on threads of their own (bounded on the node), never
//!   waited for by a loop.
//! - [`declaration`] (pure): what a pod declared (the `lifecycle.dev/probes` annotation) — the
//!   only checks answered; everything else gets 403 `forbidden` and creates nothing;
//!   `pod_declarations` joins a pod's sources (annotation and spec) and parses each once.
//! - [`server`]: the request head and its answer, binding in a pod's netns, the host-network
//!   router; [`listener`]: the per-pod listener's event loop (deadline, bound, source filter).
//! - [`source`]: who may connect (`--probe-allow-from`: the node's addresses by default).
//! - [`supervisor`]: follows the model's snapshots; makes and drops probes and listeners, and
//!   tells the model which containers to watch.
//! - [`metrics`]: `lifecycle_probe_*` series.
//!
//! # Endpoints (on the per-pod listener, default port [`server::DEFAULT_POD_PORT`])
//! - `/probe/tcp?port=8080[&stall=5s]` — a listener on 8080 exists and accepts within `stall`
//!   (default 5s); fails at once when it closes, when its queue overflowed, or when connections
//!   wait longer than `stall`.
//! - `/probe/process[?max_d_state=10s]` — the main process is not stopped, zombie or gone.
//! - `/probe/file?path=/tmp/healthy[&fresh=30s][&contains=ok]` — in the container's root.
//! - `/probe/all?tcp=8080&process&file=/tmp/healthy` — all of them (modifiers stall, max_d_state,
//!   fresh, contains apply to their kind).
//!
//! 200 `ok`, 503 with a one-line reason; 403 `forbidden` for anything the pod did not declare
//! (see [`declaration`]). A kubelet probe: `httpGet: {path: /probe/tcp?port=8080&stall=5s, port:
//! 9891}`, with the same path in the pod's `lifecycle.dev/probes` annotation.
//!
//! # Host network
//! `hostNetwork: true` pods share the node netns, so the per-pod listener cannot exist for them;
//! the node-side listener (the agent's configurable probe port on the node) serves
//! `/probe/<namespace>/<pod>/<container>/<kind>?...` through [`server::NodeProbes`]. Their tcp
//! checks see every listener of the node netns on that port (ports are node-wide there anyway).

pub mod check;
pub mod container;
pub mod declaration;
pub mod feeds;
pub mod files;
pub mod listener;
pub mod metrics;
pub(crate) mod pod;
mod pod_declarations;
pub mod query;
pub mod rates;
pub mod server;
pub mod source;
pub(crate) mod supervisor;
pub(crate) mod tcp;

pub(crate) use check::CheckSpec;
pub use pod::PodProbe;
pub use server::{bind_in_netns, NodeProbes, ProbeAnswer};
