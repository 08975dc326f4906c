//! The kernel log (`/dev/kmsg`), read for one kind of line: the OOM killer's account of each
//! kill (`oom-kill:...`), the only place that names the cgroup whose memory limit fired
//! ([`crate::model::oom`]). Read from the end of the log at start: older kills are not this
//! agent's to judge. Where `kernel.dmesg_restrict` is 1, reading needs CAP_SYSLOG.

use std::{
    fs::File,
    io::{self, Read as _, Seek as _, SeekFrom},
};

use crate::model::oom::KernelOomKill;

/// The device: one record per read.
const KMSG: &str = "/dev/kmsg";

/// A reader of the kernel log, at its end when opened.
pub struct KernelLog {
    file: File,
    /// One record (the kernel's are at most 1 KiB of text plus their prefix).
    buffer: Vec<u8>,
}

impl KernelLog {
    /// Opens `/dev/kmsg` and skips what is already logged.
    pub fn open() -> io::Result<Self> {
        let mut file = File::open(KMSG)?;
        file.seek(SeekFrom::End(0))?;
        Ok(Self { file, buffer: vec![0; 8192] })
    }

    /// Blocks until the next record; the OOM kill it reports, if it is one. Records the kernel
    /// overwrote before they were read are skipped (they are gone).
    pub fn next_oom_kill(&mut self) -> io::Result<Option<KernelOomKill>> {
        let n = match self.file.read(&mut self.buffer) {
            Ok(0) => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the kernel log ended")),
            Ok(n) => n,
            // EPIPE: the reader fell behind and records were overwritten; the next read goes on.
            Err(err) if err.raw_os_error() == Some(libc::EPIPE) => return Ok(None),
            Err(err) if err.kind() == io::ErrorKind::Interrupted => return Ok(None),
            Err(err) => return Err(err),
        };
        Ok(record_message(&self.buffer[..n]).and_then(KernelOomKill::parse))
    }
}

/// The message of a record, `<prefix>,<seq>,<time>,<flags>[,...];<message>\n[ KEY=value\n...]`:
/// its first line after the `;`.
fn record_message(record: &[u8]) -> Option<&str> {
    let text = std::str::from_utf8(record).ok()?;
    let (_, message) = text.split_once(';')?;
    message.lines().next()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_records_message_is_its_first_line_after_the_prefix() {
        let record = b"3,1234,20820451820,-;oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,\
mems_allowed=0,global_oom,task_memcg=/user.slice,task=big,pid=77,uid=0\n SUBSYSTEM=memory\n";
        let message = record_message(record).expect("message");
        assert!(message.ends_with("pid=77,uid=0"), "{message}");
        let kill = KernelOomKill::parse(message).expect("an OOM kill");
        assert_eq!((kill.pid, kill.oom_memcg), (77, None));
        assert_eq!(record_message(b"no separator"), None);
    }
}
