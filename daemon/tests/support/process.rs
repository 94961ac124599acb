//! Real `dltsub` processes in tests: a child that is killed (after a SIGCONT, in case a
//! test stopped it) when the test ends, and free ports to give it.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

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

/// A `dltsub devnet` on `127.0.0.1:port` committing after `commit_latency`, once it answers.
pub async fn spawn_devnet(port: u16, commit_latency: &str) -> Process {
    let devnet = Process(
        Command::new(env!("CARGO_BIN_EXE_dltsub"))
            .args([
                "devnet",
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--commit-latency",
                commit_latency,
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for_http(&format!("http://127.0.0.1:{port}/_devnet/stats")).await;
    devnet
}

/// The body of the first 2xx answer of `url`, asked every 100 ms for up to 30 s.
pub async fn wait_for_http(url: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(response) = reqwest::get(url).await
            && response.status().is_success()
        {
            return response.text().await.unwrap();
        }
        assert!(Instant::now() < deadline, "{url} did not answer");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
