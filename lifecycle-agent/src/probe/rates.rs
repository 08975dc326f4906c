//! How often each source address may do something that costs the agent: keep a connection
//! open waiting for its request (the probe and health listeners), or take the place of another
//! source's connection (`--listen`). A token bucket per source, in a bounded table.
//!
//! Rates, not only counts: a bound on what a source holds at once lets it come back as fast as
//! it is cut off, and each time it takes a place someone else waited for. What is rated is only
//! what costs: a request that arrives whole (the kubelet's probes) is answered without a place
//! and is never refused for its source's rate, so a client sharing the kubelet's address (a
//! hostNetwork pod) cannot spend the kubelet's turn.
//!
//! An IPv6 source is rated by its /64 (one host gets a whole /64 and can use every address of
//! it). The table keeps at most [`MAX_SOURCES`] sources; past that, sources whose bucket is full
//! again are forgotten (they owe nothing), and while every kept one still owes, new sources
//! share one bucket.

use std::{collections::HashMap, net::IpAddr, time::Instant};

/// Sources whose buckets are kept at most.
pub const MAX_SOURCES: usize = 4096;

/// One source's allowance: `per_second` refills, up to `burst`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rate {
    pub per_second: f64,
    pub burst: f64,
}

#[derive(Clone, Copy, Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn full(rate: Rate, now: Instant) -> Self {
        Self { tokens: rate.burst, at: now }
    }

    fn refill(&mut self, rate: Rate, now: Instant) {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * rate.per_second).min(rate.burst);
        self.at = now;
    }

    fn take(&mut self, rate: Rate, now: Instant) -> bool {
        self.refill(rate, now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Whether the bucket is full again at `now` (the source owes nothing).
    fn settled(&self, rate: Rate, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens + elapsed * rate.per_second >= rate.burst
    }
}

/// Token buckets by source (see the module header).
pub(crate) struct SourceRates {
    rate: Rate,
    buckets: HashMap<IpAddr, Bucket>,
    /// Shared by new sources while the table is full of sources that still owe.
    overflow: Bucket,
}

impl SourceRates {
    pub(crate) fn new(rate: Rate) -> Self {
        let now = Instant::now();
        Self { rate, buckets: HashMap::new(), overflow: Bucket::full(rate, now) }
    }

    /// Whether `source` may do one more costly thing at `now` (and, if so, it is counted).
    pub(crate) fn admit(&mut self, source: IpAddr, now: Instant) -> bool {
        let key = rated_as(source);
        let rate = self.rate;
        if let Some(bucket) = self.buckets.get_mut(&key) {
            return bucket.take(rate, now);
        }
        if self.buckets.len() >= MAX_SOURCES {
            self.buckets.retain(|_, bucket| !bucket.settled(rate, now));
        }
        if self.buckets.len() >= MAX_SOURCES {
            return self.overflow.take(rate, now);
        }
        self.buckets.entry(key).or_insert_with(|| Bucket::full(rate, now)).take(rate, now)
    }

    /// Sources kept now.
    #[cfg(test)]
    fn kept(&self) -> usize {
        self.buckets.len()
    }
}

/// The key a source is rated under: its address, or an IPv6 address's /64.
fn rated_as(source: IpAddr) -> IpAddr {
    match source.to_canonical() {
        IpAddr::V6(v6) => {
            let mut segments = v6.segments();
            segments[4..].fill(0);
            IpAddr::V6(segments.into())
        }
        v4 => v4,
    }
}

/// How long a source whose bucket is empty waits for its next token.
#[cfg(test)]
fn refill_time(rate: Rate) -> std::time::Duration {
    std::time::Duration::from_secs_f64(1.0 / rate.per_second)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const RATE: Rate = Rate { per_second: 10.0, burst: 4.0 };

    #[test]
    fn a_source_gets_its_burst_then_its_rate_and_others_are_not_charged() {
        let mut rates = SourceRates::new(RATE);
        let now = Instant::now();
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().expect("ip"), "10.0.0.2".parse().expect("ip"));
        assert_eq!((0..6).filter(|_| rates.admit(a, now)).count(), 4, "the burst");
        assert!(rates.admit(b, now), "another source has its own bucket");
        assert!(!rates.admit(a, now + refill_time(RATE) / 2));
        assert!(rates.admit(a, now + refill_time(RATE) + Duration::from_millis(1)), "one token a tenth of a second");
    }

    #[test]
    fn an_ipv6_host_is_one_source_for_its_whole_64() {
        let mut rates = SourceRates::new(RATE);
        let now = Instant::now();
        let admitted =
            (0..8u16).filter(|i| rates.admit(format!("2001:db8:1:2::{i:x}").parse().expect("ip"), now)).count();
        assert_eq!(admitted, 4);
        assert!(rates.admit("2001:db8:1:3::1".parse().expect("ip"), now), "the next /64 is another source");
        // An IPv4 address seen through a dual-stack socket is the IPv4 source.
        assert_eq!(rated_as("::ffff:10.0.0.1".parse().expect("ip")), "10.0.0.1".parse::<IpAddr>().expect("ip"));
    }

    #[test]
    fn the_table_is_bounded_and_sources_that_owe_nothing_make_room() {
        let mut rates = SourceRates::new(RATE);
        let now = Instant::now();
        let source = |i: usize| IpAddr::from([10, (i >> 16) as u8, (i >> 8) as u8, i as u8]);
        for i in 0..MAX_SOURCES {
            assert!(rates.admit(source(i), now));
        }
        assert_eq!(rates.kept(), MAX_SOURCES);
        // Every kept source still owes: newcomers share one bucket (its burst, then nothing).
        let shared = (0..10).filter(|i| rates.admit(source(MAX_SOURCES + i), now)).count();
        assert_eq!(shared, 4);
        assert_eq!(rates.kept(), MAX_SOURCES, "never more than the bound");
        // Once they owe nothing they are forgotten, and newcomers get buckets of their own.
        let later = now + Duration::from_secs(1);
        assert!(rates.admit(source(MAX_SOURCES + 100), later));
        assert_eq!(rates.kept(), 1);
    }
}
