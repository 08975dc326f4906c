//! The hand-written /proc parsers the probes use: `discovery::proc::{parse_stat,
//! parse_listeners, parse_netstat}`, on arbitrary text and on files written the kernel's way
//! from the input's values.
//!
//! Properties, arbitrary text: no panic; `parse_listeners` returns one listener per LISTEN (`0A`)
//! row, in the family asked for. Kernel-format files: `stat` with any comm (spaces, parentheses,
//! newlines) gives back its state and start time; a socket table gives back the port and accept
//! queue of exactly its LISTEN rows; `netstat` gives back ListenOverflows and ListenDrops wherever
//! they sit in the TcpExt line.

#![no_main]

use libfuzzer_sys::fuzz_target;
use lifecycle_agent::discovery::proc::{
    parse_listeners, parse_netstat, parse_stat, ListenCounters, Listener, ProcessSample, ProcessState,
};

const AF_INET: u16 = 2;
const AF_INET6: u16 = 10;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Ok(sample) = parse_stat(&text) {
        assert!(text.contains(')'), "a stat line without comm parsed: {sample:?}");
    }
    for family in [AF_INET, AF_INET6] {
        if let Ok(listeners) = parse_listeners(&text, family) {
            let rows = text.lines().skip(1).filter(|l| l.split_whitespace().nth(3) == Some("0A")).count();
            assert_eq!(listeners.len(), rows, "{text:?}");
            assert!(listeners.iter().all(|l| l.family == family && l.backlog.is_none()), "{listeners:?}");
        }
    }
    if parse_netstat(&text).is_ok() {
        assert!(text.lines().filter(|l| l.starts_with("TcpExt:")).count() >= 2, "{text:?}");
    }

    let mut input = Bytes(data);
    stat_round_trip(&mut input);
    listeners_round_trip(&mut input);
    netstat_round_trip(&mut input);
});

/// Reads fixed-size values off the input, zeros once it runs out.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        let n = self.0.len().min(N);
        out[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        out
    }

    fn u8(&mut self) -> u8 {
        self.take::<1>()[0]
    }

    fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.take())
    }

    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take())
    }

    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take())
    }
}

fn stat_round_trip(input: &mut Bytes) {
    let (letter, state) = [
        ('R', ProcessState::Running),
        ('S', ProcessState::Sleeping),
        ('D', ProcessState::Uninterruptible),
        ('T', ProcessState::Stopped),
        ('t', ProcessState::Stopped),
        ('Z', ProcessState::Zombie),
        ('X', ProcessState::Dead),
        ('I', ProcessState::Other('I')),
    ][usize::from(input.u8() % 8)];
    let start_ticks = input.u64();
    // The kernel keeps 15 bytes of comm, any byte but NUL; the parser must not care how many.
    let comm_len = usize::from(input.u8() % 32).min(input.0.len());
    let comm = String::from_utf8_lossy(&input.0[..comm_len]).replace('\0', "");
    input.0 = &input.0[comm_len..];
    let line = format!(
        "4242 ({comm}) {letter} 1 4242 4242 0 -1 4194560 2375 0 0 0 3 1 0 0 20 0 1 0 {start_ticks} 12746752 \
         1024 18446744073709551615 1 1 0 0 0 0 0 4096 17 1 0 0 0 0 0\n"
    );
    assert_eq!(parse_stat(&line), Ok(ProcessSample { state, start_ticks }), "{line:?}");
}

fn listeners_round_trip(input: &mut Bytes) {
    let family = if input.u8() & 1 == 0 { AF_INET } else { AF_INET6 };
    let address = if family == AF_INET { "0100007F" } else { "00000000000000000000000001000000" };
    let mut table = String::from(
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n",
    );
    let mut want = Vec::new();
    for row in 0..usize::from(input.u8() % 8) {
        let (port, queue_depth, listening) = (input.u16(), input.u32(), input.u8() & 1 == 1);
        let state = if listening { "0A" } else { "01" };
        let inode = 10_000 + row as u64;
        table.push_str(&format!(
            "{row:4}: {address}:{port:04X} {address}:0000 {state} 00000000:{queue_depth:08X} 00:00000000 00000000 \
             0        0 {inode} 1 0000000000000000 100 0 0 10 0\n"
        ));
        if listening {
            want.push(Listener { port, family, queue_depth, backlog: None, inode });
        }
    }
    assert_eq!(parse_listeners(&table, family), Ok(want), "{table}");
}

fn netstat_round_trip(input: &mut Bytes) {
    const OTHERS: [&str; 8] = [
        "SyncookiesSent",
        "SyncookiesRecv",
        "EmbryonicRsts",
        "PruneCalled",
        "TW",
        "DelayedACKs",
        "TCPHPHits",
        "TCPPureAcks",
    ];
    let (before, between) = (usize::from(input.u8() % 8), usize::from(input.u8() % 8));
    let (overflows, drops) = (input.u64(), input.u64());
    let mut names = vec!["TcpExt:"];
    let mut values = vec!["TcpExt:".to_owned()];
    for (i, name) in OTHERS.iter().take(before).enumerate() {
        names.push(name);
        values.push(i.to_string());
    }
    names.push("ListenOverflows");
    values.push(overflows.to_string());
    for (i, name) in OTHERS.iter().skip(before).take(between).enumerate() {
        names.push(name);
        values.push(i.to_string());
    }
    names.push("ListenDrops");
    values.push(drops.to_string());
    let text = format!(
        "IpExt: InNoRoutes InTruncatedPkts\nIpExt: 0 0\nTcpExt: {}\n{}\nMPTcpExt: MPCapableSYNRX\nMPTcpExt: 0\n",
        names[1..].join(" "),
        values.join(" ")
    );
    assert_eq!(parse_netstat(&text), Ok(ListenCounters { overflows, drops }), "{text}");
}
