//! A real nginx running the shipped `config/nginx.conf` (only its addresses
//! rewritten) in front of a small origin, for the tests that live the quick
//! start as a visitor does: `tests/api/nginx.rs` with an HTTP client and
//! `tests/browser.rs` with Chromium.

use std::net::TcpListener as StdListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::OriginalUri;

/// nginx as a child process on a free port, stopped on drop.
pub struct Nginx {
    child: Child,
    pub base: String,
    _dir: tempfile::TempDir,
}

impl Nginx {
    /// `narabu` and `origin` are `host:port` addresses.
    pub fn start(narabu: &str, origin: &str) -> Nginx {
        let port = StdListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let shipped = include_str!("../../config/nginx.conf");
        let conf = shipped
            .replace("127.0.0.1:8080", narabu)
            .replace("127.0.0.1:3000", origin)
            .replace("127.0.0.1:8000", &format!("127.0.0.1:{port}"))
            .replace("worker_processes auto;", "worker_processes 1;");
        assert_ne!(conf, shipped, "the addresses were rewritten");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nginx.conf");
        std::fs::write(&path, conf).unwrap();
        // One process (master_process off): a kill of a master would leave
        // its workers behind, holding the port and the test's output open.
        let globals = format!(
            "daemon off; master_process off; pid {}/nginx.pid;",
            dir.path().display()
        );
        let child = Command::new("nginx")
            .arg("-p")
            .arg(dir.path())
            .arg("-c")
            .arg(&path)
            .arg("-g")
            .arg(globals)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("nginx is installed (scripts/test installs it)");
        let address = format!("127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(&address).is_err() {
            assert!(Instant::now() < deadline, "nginx did not start listening");
            std::thread::sleep(Duration::from_millis(50));
        }
        Nginx {
            child,
            base: format!("http://{address}"),
            _dir: dir,
        }
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The protected site: it names the page it served, so the test knows the
/// request really reached it. Returns its `host:port`.
pub async fn spawn_origin() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = Router::new().fallback(|OriginalUri(uri): OriginalUri| async move {
        format!("origin page {}", uri.path())
    });
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr.to_string()
}
