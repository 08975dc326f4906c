//! One loaded sensor per test binary, its events collected on a background thread,
//! and waits that block until a matching event arrives (or fail after a deadline).

use std::{
    sync::{Arc, Condvar, Mutex, OnceLock},
    time::{Duration, Instant},
};

use lifecycle_agent::{
    kernel::{Sensor, SensorConfig, SensorMaps},
    model::event::Event,
};

pub struct Hub {
    events: Mutex<Vec<Event>>,
    arrived: Condvar,
    pub maps: Arc<SensorMaps>,
}

/// How long a test waits for the kernel to report something before failing.
pub const EVENT_DEADLINE: Duration = Duration::from_secs(10);

impl Hub {
    /// The shared hub, loading the sensor on first use.
    pub fn get() -> &'static Hub {
        static HUB: OnceLock<&'static Hub> = OnceLock::new();
        HUB.get_or_init(|| {
            let mut sensor = Sensor::load(&SensorConfig::default()).expect("load the sensor");
            for state in sensor.features() {
                assert!(state.enabled, "feature {:?} is off on this kernel: {:?}", state.feature, state.reason);
            }
            let stream = sensor.take_events().expect("event stream");
            let hub: &'static Hub = Box::leak(Box::new(Hub {
                events: Mutex::new(Vec::new()),
                arrived: Condvar::new(),
                maps: sensor.maps(),
            }));
            std::thread::spawn(move || {
                // The sensor lives as long as the test binary: programs stay attached.
                let _sensor = sensor;
                let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
                runtime.block_on(async move {
                    let mut stream = stream.into_async(Duration::from_millis(2)).expect("async stream");
                    let mut batch = Vec::new();
                    loop {
                        stream.next_batch(&mut batch).await.expect("read events");
                        if !batch.is_empty() {
                            hub.events.lock().expect("lock").append(&mut batch);
                            hub.arrived.notify_all();
                        }
                    }
                });
            });
            hub
        })
    }

    /// Waits until `done` holds over the events seen so far; returns the matching events.
    pub fn wait_for(
        &self,
        what: &str,
        matches: impl Fn(&Event) -> bool,
        done: impl Fn(&[Event]) -> bool,
    ) -> Vec<Event> {
        let deadline = Instant::now() + EVENT_DEADLINE;
        let mut events = self.events.lock().expect("lock");
        loop {
            let matching: Vec<Event> = events.iter().filter(|e| matches(e)).cloned().collect();
            if done(&matching) {
                return matching;
            }
            let now = Instant::now();
            if now >= deadline {
                panic!("timed out waiting for {what}; matching so far: {matching:#?}");
            }
            events = self.arrived.wait_timeout(events, deadline - now).expect("lock").0;
        }
    }

    /// Every event so far that concerns `cgroup_id`.
    pub fn events_of(&self, cgroup_id: u64) -> Vec<Event> {
        self.events.lock().expect("lock").iter().filter(|e| e.cgroups().any(|c| c == cgroup_id)).cloned().collect()
    }
}
