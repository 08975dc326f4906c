//! What systemd says of a unit: its stop settings (`KillSignal=`, `TimeoutStopSec=`) and its
//! restart settings (`Restart=`, `RestartSec=`, `RestartSteps=`, `RestartMaxDelaySec=`, the exit
//! status lists, `NRestarts`), read over D-Bus as `systemctl show` reads them, so drop-ins,
//! defaults and `daemon-reload` all count and no unit file is parsed.
//!
//! The connection goes to systemd's own private socket (`/run/systemd/private`, peer to peer, root
//! only: what `systemctl` uses as root, present wherever systemd is PID 1, with or without a bus
//! daemon), else to the system bus. In a pod the host's `/run/systemd` is mounted (the
//! DaemonSet does). The agent makes only `GetUnit` and `Properties.GetAll` calls.
//!
//! The D-Bus implementation is libdbus, through the `dbus` crate with its `vendored` feature
//! (libdbus built from the crate's pinned sources and linked in: the image gains no library).
//! Not zbus: systemd's replies on its private socket name systemd's bus name as their sender,
//! which zbus 5 and 6 refuse as "not a unique name" (zbus issue 1497, open); with zbus 5.19 its
//! reader task panicked on the first reply and every call timed out, so no unit was ever read
//! (the kernel matrix's systemd guests, 2026-11-29). libdbus accepts them, as sd-bus does. Its
//! calls block: the caller runs them on a blocking thread.

use std::{path::Path, time::Duration};

use dbus::{
    arg::{PropMap, RefArg},
    blocking::{stdintf::org_freedesktop_dbus::Properties as _, SyncConnection},
    channel::Channel,
};
use lifecycle_model::{
    systemd::{RestartPolicy, SystemdUnit},
    time::MICROSECOND,
};

/// systemd's private socket.
pub(crate) const PRIVATE_SOCKET: &str = "/run/systemd/private";
/// The D-Bus system bus.
pub(crate) const SYSTEM_BUS_SOCKET: &str = "/run/dbus/system_bus_socket";
/// A call systemd does not answer within this is a systemd that would stall the agent.
pub(crate) const CALL_TIMEOUT: Duration = Duration::from_secs(2);

const DESTINATION: &str = "org.freedesktop.systemd1";
const MANAGER_PATH: &str = "/org/freedesktop/systemd1";
const MANAGER: &str = "org.freedesktop.systemd1.Manager";

/// Why systemd could not be asked.
#[derive(Debug, thiserror::Error)]
pub enum SystemdError {
    /// Neither socket could be connected to (no systemd, or not mounted into the pod).
    #[error("cannot connect to systemd at {private} or {bus}", private = PRIVATE_SOCKET, bus = SYSTEM_BUS_SOCKET)]
    Connect(#[source] dbus::Error),
    /// systemd answered with an error (the unit is gone, or it refused).
    #[error("systemd: {call} {unit}")]
    Call {
        call: &'static str,
        unit: String,
        #[source]
        source: dbus::Error,
    },
    /// No answer, or the connection broke (systemd re-executed, or stalls): connect again.
    #[error("systemd: {call} {unit}: no answer")]
    Broken {
        call: &'static str,
        unit: String,
        #[source]
        source: dbus::Error,
    },
}

impl SystemdError {
    /// Whether the connection is still good for other calls.
    pub(crate) fn keeps_connection(&self) -> bool {
        matches!(self, SystemdError::Call { .. })
    }

    fn of_call(call: &'static str, unit: &str, source: dbus::Error) -> Self {
        // libdbus' own errors (no reply in time, disconnected) say the link is gone; systemd's
        // (NoSuchUnit, access denied, an unknown property) that it answered.
        let from_the_link = matches!(
            source.name(),
            Some(
                "org.freedesktop.DBus.Error.NoReply"
                    | "org.freedesktop.DBus.Error.Disconnected"
                    | "org.freedesktop.DBus.Error.Timeout"
            )
        );
        let unit = unit.to_owned();
        if from_the_link {
            SystemdError::Broken { call, unit, source }
        } else {
            SystemdError::Call { call, unit, source }
        }
    }
}

/// A connection to systemd. Its calls block (at most [`CALL_TIMEOUT`] each).
pub(crate) struct SystemdClient {
    connection: SyncConnection,
}

impl SystemdClient {
    /// Connects to systemd's private socket, else to the system bus (`root` prefixes both paths:
    /// the host's root as mounted into a pod).
    pub(crate) fn connect(root: Option<&Path>) -> Result<Self, SystemdError> {
        let at = |path: &str| match root {
            Some(root) => root.join(path.trim_start_matches('/')).display().to_string(),
            None => path.to_owned(),
        };
        match Channel::open_private(&format!("unix:path={}", at(PRIVATE_SOCKET))) {
            // Peer to peer: systemd itself at the other end, no bus to say Hello to.
            Ok(channel) => return Ok(Self { connection: SyncConnection::from(channel) }),
            Err(err) => log::debug!("systemd's private socket: {err}"),
        }
        let mut channel =
            Channel::open_private(&format!("unix:path={}", at(SYSTEM_BUS_SOCKET))).map_err(SystemdError::Connect)?;
        channel.register().map_err(SystemdError::Connect)?;
        Ok(Self { connection: SyncConnection::from(channel) })
    }

    /// The settings of unit `name` (`nginx.service`, `session-3.scope`).
    pub(crate) fn unit(&self, name: &str) -> Result<SystemdUnit, SystemdError> {
        let manager = self.connection.with_proxy(DESTINATION, MANAGER_PATH, CALL_TIMEOUT);
        let (path,): (dbus::Path<'static>,) = manager
            .method_call(MANAGER, "GetUnit", (name,))
            .map_err(|err| SystemdError::of_call("GetUnit", name, err))?;
        let interface = if name.ends_with(".scope") {
            "org.freedesktop.systemd1.Scope"
        } else {
            "org.freedesktop.systemd1.Service"
        };
        let unit = self.connection.with_proxy(DESTINATION, path, CALL_TIMEOUT);
        let properties = unit.get_all(interface).map_err(|err| SystemdError::of_call("GetAll", name, err))?;
        Ok(unit_from_properties(name, &properties))
    }
}

/// The model's [`SystemdUnit`] from a unit's D-Bus properties; a property this systemd lacks
/// (older versions have no `RestartSteps`) keeps systemd's default.
pub(crate) fn unit_from_properties(name: &str, properties: &PropMap) -> SystemdUnit {
    let defaults = SystemdUnit::default();
    let u64_of = |key: &str| properties.get(key).and_then(|v| v.0.as_u64());
    let u32_of = |key: &str| properties.get(key).and_then(|v| v.0.as_u64()).and_then(|n| u32::try_from(n).ok());
    // µs, where u64::MAX is `infinity`.
    let duration = |key: &str| u64_of(key).map(|us| (us != u64::MAX).then(|| us.saturating_mul(MICROSECOND)));
    // `(aiai)`: exit codes, then signals; values past a byte are no exit status.
    let status_lists = |key: &str| -> (Vec<u8>, Vec<u8>) {
        let Some(mut fields) = properties.get(key).and_then(|v| v.0.as_iter()) else { return Default::default() };
        let bytes = |field: Option<&dyn RefArg>| -> Vec<u8> {
            field
                .and_then(RefArg::as_iter)
                .map(|items| items.filter_map(|n| n.as_i64()).filter_map(|n| u8::try_from(n).ok()).collect())
                .unwrap_or_default()
        };
        let codes = bytes(fields.next());
        (codes, bytes(fields.next()))
    };
    let (success_exit_codes, success_signals) = status_lists("SuccessExitStatus");
    let (prevent_exit_codes, prevent_signals) = status_lists("RestartPreventExitStatus");
    let (force_exit_codes, force_signals) = status_lists("RestartForceExitStatus");
    let restart =
        properties.get("Restart").and_then(|v| v.0.as_str()).and_then(RestartPolicy::parse).unwrap_or(defaults.restart);
    SystemdUnit {
        name: name.to_owned(),
        kill_signal: properties
            .get("KillSignal")
            .and_then(|v| v.0.as_i64())
            .and_then(|signal| u8::try_from(signal).ok())
            .unwrap_or(defaults.kill_signal),
        timeout_stop_ns: duration("TimeoutStopUSec").unwrap_or(defaults.timeout_stop_ns),
        restart,
        restart_ns: duration("RestartUSec").flatten().unwrap_or(defaults.restart_ns),
        restart_steps: u32_of("RestartSteps").unwrap_or(defaults.restart_steps),
        restart_max_delay_ns: duration("RestartMaxDelayUSec").unwrap_or(defaults.restart_max_delay_ns),
        success_exit_codes,
        success_signals,
        prevent_exit_codes,
        prevent_signals,
        force_exit_codes,
        force_signals,
        restarts: u32_of("NRestarts").unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use dbus::arg::Variant;

    use super::*;

    fn value(value: impl RefArg + 'static) -> Variant<Box<dyn RefArg>> {
        Variant(Box::new(value))
    }

    #[test]
    fn properties_become_the_units_settings_and_missing_ones_systemds_defaults() {
        let mut properties = PropMap::new();
        properties.insert("KillSignal".to_owned(), value(2i32));
        properties.insert("TimeoutStopUSec".to_owned(), value(2_000_000u64));
        properties.insert("Restart".to_owned(), value("on-failure".to_owned()));
        properties.insert("RestartUSec".to_owned(), value(500_000u64));
        properties.insert("RestartMaxDelayUSec".to_owned(), value(u64::MAX));
        properties.insert("NRestarts".to_owned(), value(4u32));
        properties.insert("RestartPreventExitStatus".to_owned(), value((vec![3i32, 300], vec![9i32])));
        let unit = unit_from_properties("web.service", &properties);
        assert_eq!(unit.kill_signal, 2);
        assert_eq!(unit.timeout_stop_ns, Some(2 * lifecycle_model::time::SECOND));
        assert_eq!(
            (unit.restart, unit.restart_ns),
            (RestartPolicy::OnFailure, 500 * lifecycle_model::time::MILLISECOND)
        );
        assert_eq!(unit.restart_max_delay_ns, None, "infinity");
        assert_eq!(unit.restart_steps, 0, "not reported by this systemd: its default");
        assert_eq!((unit.prevent_exit_codes, unit.prevent_signals), (vec![3], vec![9]), "300 is no exit code");
        assert_eq!(unit.restarts, 4);
        let infinite = PropMap::from([("TimeoutStopUSec".to_owned(), value(u64::MAX))]);
        assert_eq!(unit_from_properties("x.scope", &infinite).timeout_stop_ns, None);
    }

    #[test]
    fn systemds_own_answers_keep_the_connection_and_the_links_do_not() {
        let gone = dbus::Error::new_custom("org.freedesktop.systemd1.NoSuchUnit", "Unit x.service not loaded.");
        assert!(SystemdError::of_call("GetUnit", "x.service", gone).keeps_connection());
        let silent = dbus::Error::new_custom("org.freedesktop.DBus.Error.NoReply", "no reply");
        assert!(!SystemdError::of_call("GetAll", "x.service", silent).keeps_connection());
    }
}
