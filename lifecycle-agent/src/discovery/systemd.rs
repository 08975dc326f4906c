//! What systemd says of a unit: its stop settings (`KillSignal=`, `TimeoutStopSec=`) and its
//! restart settings (`Restart=`, `RestartSec=`, `RestartSteps=`, `RestartMaxDelaySec=`, the exit
//! status lists, `NRestarts`), read over D-Bus as `systemctl show` reads them, so drop-ins,
//! defaults and `daemon-reload` all count and no unit file is parsed.
//!
//! The connection goes to systemd's own private socket (`/run/systemd/private`, peer to peer, root
//! only: what `systemctl` uses as root, present wherever systemd is PID 1, with or without a bus
//! daemon), else to the system bus. In a pod the host's `/run/systemd` is mounted (the
//! DaemonSet does). zbus is the D-Bus implementation of the Rust ecosystem; the agent makes only
//! `GetUnit` and `Properties.GetAll` calls with it.

use std::{collections::HashMap, path::PathBuf, time::Duration};

use lifecycle_model::{
    systemd::{RestartPolicy, SystemdUnit},
    time::MICROSECOND,
};
use zbus::zvariant::{OwnedObjectPath, OwnedValue};

/// systemd's private socket.
pub(crate) const PRIVATE_SOCKET: &str = "/run/systemd/private";
/// The D-Bus system bus.
pub(crate) const SYSTEM_BUS_SOCKET: &str = "/run/dbus/system_bus_socket";
/// A call systemd does not answer within this is a systemd that would stall the agent.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);

const DESTINATION: &str = "org.freedesktop.systemd1";
const MANAGER_PATH: &str = "/org/freedesktop/systemd1";
const MANAGER: &str = "org.freedesktop.systemd1.Manager";
const PROPERTIES: &str = "org.freedesktop.DBus.Properties";

/// Why systemd could not be asked.
#[derive(Debug, thiserror::Error)]
pub enum SystemdError {
    /// Neither socket could be connected to (no systemd, or not mounted into the pod).
    #[error("cannot connect to systemd at {private} or {bus}", private = PRIVATE_SOCKET, bus = SYSTEM_BUS_SOCKET)]
    Connect(#[source] zbus::Error),
    /// A call failed (the unit is gone, or systemd refused).
    #[error("systemd: {call} {unit}")]
    Call {
        call: &'static str,
        unit: String,
        #[source]
        source: zbus::Error,
    },
    /// A call got no answer in time.
    #[error("systemd did not answer {call} for {unit} within {CALL_TIMEOUT:?}")]
    Timeout { call: &'static str, unit: String },
}

/// A connection to systemd.
pub(crate) struct SystemdClient {
    connection: zbus::Connection,
    /// Peer to peer (the private socket): no bus to route by destination.
    peer: bool,
}

impl SystemdClient {
    /// Connects to systemd's private socket, else to the system bus.
    pub(crate) async fn connect(root: Option<&PathBuf>) -> Result<Self, SystemdError> {
        let at = |path: &str| match root {
            Some(root) => root.join(path.trim_start_matches('/')).display().to_string(),
            None => path.to_owned(),
        };
        let private = async {
            zbus::connection::Builder::address(format!("unix:path={}", at(PRIVATE_SOCKET)).as_str())?
                .p2p()
                .build()
                .await
        };
        match tokio::time::timeout(CALL_TIMEOUT, private).await {
            Ok(Ok(connection)) => return Ok(Self { connection, peer: true }),
            Ok(Err(err)) => log::debug!("systemd's private socket: {err}"),
            Err(_) => log::debug!("systemd's private socket did not answer"),
        }
        let bus = async {
            zbus::connection::Builder::address(format!("unix:path={}", at(SYSTEM_BUS_SOCKET)).as_str())?.build().await
        };
        match tokio::time::timeout(CALL_TIMEOUT, bus).await {
            Ok(Ok(connection)) => Ok(Self { connection, peer: false }),
            Ok(Err(err)) => Err(SystemdError::Connect(err)),
            Err(_) => Err(SystemdError::Connect(zbus::Error::Failure("no answer in time".into()))),
        }
    }

    async fn call<B>(
        &self,
        path: &str,
        interface: &str,
        method: &'static str,
        body: &B,
        unit: &str,
    ) -> Result<zbus::Message, SystemdError>
    where
        B: serde::Serialize + zbus::zvariant::DynamicType,
    {
        let destination = (!self.peer).then_some(DESTINATION);
        let call = self.connection.call_method(destination, path, Some(interface), method, body);
        match tokio::time::timeout(CALL_TIMEOUT, call).await {
            Ok(result) => result.map_err(|source| SystemdError::Call { call: method, unit: unit.to_owned(), source }),
            Err(_) => Err(SystemdError::Timeout { call: method, unit: unit.to_owned() }),
        }
    }

    /// The settings of unit `name` (`nginx.service`, `session-3.scope`).
    pub(crate) async fn unit(&self, name: &str) -> Result<SystemdUnit, SystemdError> {
        let reply = self.call(MANAGER_PATH, MANAGER, "GetUnit", &(name,), name).await?;
        let path: OwnedObjectPath = reply.body().deserialize().map_err(|source| SystemdError::Call {
            call: "GetUnit",
            unit: name.to_owned(),
            source,
        })?;
        let interface = if name.ends_with(".scope") {
            "org.freedesktop.systemd1.Scope"
        } else {
            "org.freedesktop.systemd1.Service"
        };
        let reply = self.call(path.as_str(), PROPERTIES, "GetAll", &(interface,), name).await?;
        let properties: HashMap<String, OwnedValue> = reply
            .body()
            .deserialize()
            .map_err(|source| SystemdError::Call { call: "GetAll", unit: name.to_owned(), source })?;
        Ok(unit_from_properties(name, &properties))
    }
}

/// The model's [`SystemdUnit`] from a unit's D-Bus properties; a property this systemd lacks
/// (older versions have no `RestartSteps`) keeps systemd's default.
pub(crate) fn unit_from_properties(name: &str, properties: &HashMap<String, OwnedValue>) -> SystemdUnit {
    let defaults = SystemdUnit::default();
    let u64_of = |key: &str| properties.get(key).and_then(|v| u64::try_from(v).ok());
    let u32_of = |key: &str| properties.get(key).and_then(|v| u32::try_from(v).ok());
    // µs, where u64::MAX is `infinity`.
    let duration = |key: &str| u64_of(key).map(|us| (us != u64::MAX).then(|| us.saturating_mul(MICROSECOND)));
    let status_lists = |key: &str| -> (Vec<u8>, Vec<u8>) {
        let Some(value) = properties.get(key).and_then(|v| v.try_clone().ok()) else { return Default::default() };
        let (codes, signals): (Vec<i32>, Vec<i32>) = <(Vec<i32>, Vec<i32>)>::try_from(value).unwrap_or_default();
        let bytes = |list: Vec<i32>| list.into_iter().filter_map(|n| u8::try_from(n).ok()).collect();
        (bytes(codes), bytes(signals))
    };
    let (success_exit_codes, success_signals) = status_lists("SuccessExitStatus");
    let (prevent_exit_codes, prevent_signals) = status_lists("RestartPreventExitStatus");
    let (force_exit_codes, force_signals) = status_lists("RestartForceExitStatus");
    let restart = properties
        .get("Restart")
        .and_then(|v| <&str>::try_from(v).ok())
        .and_then(RestartPolicy::parse)
        .unwrap_or(defaults.restart);
    SystemdUnit {
        name: name.to_owned(),
        kill_signal: properties
            .get("KillSignal")
            .and_then(|v| i32::try_from(v).ok())
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
    use super::*;
    use zbus::zvariant::{Structure, Value};

    fn owned(value: Value<'_>) -> OwnedValue {
        value.try_to_owned().expect("owned")
    }

    #[test]
    fn properties_become_the_units_settings_and_missing_ones_systemds_defaults() {
        let mut properties = HashMap::new();
        properties.insert("KillSignal".to_owned(), owned(Value::I32(2)));
        properties.insert("TimeoutStopUSec".to_owned(), owned(Value::U64(2_000_000)));
        properties.insert("Restart".to_owned(), owned(Value::from("on-failure")));
        properties.insert("RestartUSec".to_owned(), owned(Value::U64(500_000)));
        properties.insert("RestartMaxDelayUSec".to_owned(), owned(Value::U64(u64::MAX)));
        properties.insert("NRestarts".to_owned(), owned(Value::U32(4)));
        let lists = Structure::from((vec![3i32, 300], vec![9i32]));
        properties.insert("RestartPreventExitStatus".to_owned(), owned(Value::Structure(lists)));
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
        let infinite = HashMap::from([("TimeoutStopUSec".to_owned(), owned(Value::U64(u64::MAX)))]);
        assert_eq!(unit_from_properties("x.scope", &infinite).timeout_stop_ns, None);
    }
}
