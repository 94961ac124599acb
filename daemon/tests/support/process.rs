//! Real `dltsub` processes in tests: a child that is killed (after a SIGCONT, in case a
//! test stopped it) when the test ends, and free ports to give it.

use std::net::TcpListener;
use std::process::{Child, Command};

/// A child process killed and reaped when dropped, so no test leaves one behind.
pub struct Process(pub Child);

impl Drop for Process {
    fn drop(&mut self) {
        // A stopped process must be continued to die promptly and be reaped.
        let _ = Command::new("kill")
            .args(["-CONT", &self.0.id().to_string()])
            .status();
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A port nothing listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
