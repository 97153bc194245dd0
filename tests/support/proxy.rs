//! Real reverse proxies running the shipped configurations (only their
//! addresses rewritten) in front of a small origin, with Narabu as their
//! gate: nginx (`config/nginx.conf`), Caddy (`config/Caddyfile`) and HAProxy
//! (`config/haproxy.cfg` with `config/narabu.lua`), each as Debian packages
//! it (`scripts/test` installs them). For the tests that live the quick
//! start as a visitor does: `tests/api/proxies.rs` with an HTTP client and
//! `tests/browser.rs` with Chromium. Each includes this file with `#[path]`.

use std::net::TcpListener as StdListener;
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::OriginalUri;

/// Which proxy, and how it asks the gate.
#[derive(Clone, Copy, Debug)]
pub enum Kind {
    /// `auth_request`: the gate's 401 becomes nginx's own 302.
    Nginx,
    /// `forward_auth` with `?redirect=1`: the gate's 302 goes to the browser.
    Caddy,
    /// The `lua.narabu-gate` action, with HAProxy's built-in HTTP client.
    Haproxy,
}

/// A proxy as a child process on a free port, stopped on drop.
pub struct Proxy {
    child: Child,
    pub base: String,
    dir: tempfile::TempDir,
}

/// The shipped configuration's addresses: where the proxy listens, Narabu
/// and the origin.
const LISTEN: &str = "127.0.0.1:8000";
const NARABU: &str = "127.0.0.1:8080";
const ORIGIN: &str = "127.0.0.1:3000";

impl Proxy {
    /// `narabu` and `origin` are `host:port` addresses.
    pub fn start(kind: Kind, narabu: &str, origin: &str) -> Proxy {
        let port = StdListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let address = format!("127.0.0.1:{port}");
        let dir = tempfile::tempdir().unwrap();
        let rewrite = |shipped: &str| {
            let conf = shipped
                .replace(NARABU, narabu)
                .replace(ORIGIN, origin)
                .replace(LISTEN, &address);
            assert!(
                !conf.contains(NARABU) && !conf.contains(ORIGIN) && conf.contains(&address),
                "every address was rewritten"
            );
            conf
        };
        let mut command = match kind {
            Kind::Nginx => nginx(
                dir.path(),
                &rewrite(include_str!("../../config/nginx.conf")),
            ),
            Kind::Caddy => caddy(dir.path(), &rewrite(include_str!("../../config/Caddyfile"))),
            Kind::Haproxy => haproxy(
                dir.path(),
                &rewrite(include_str!("../../config/haproxy.cfg")),
            ),
        };
        // Its own log, shown if it fails to start: Caddy is chatty.
        let log = std::fs::File::create(dir.path().join("proxy.log")).unwrap();
        let mut child = command
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("{kind:?} is installed (scripts/test installs it): {e}"));
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(&address).is_err() {
            let exited = child.try_wait().unwrap();
            if exited.is_some() || Instant::now() > deadline {
                let log = std::fs::read_to_string(dir.path().join("proxy.log")).unwrap();
                panic!("{kind:?} did not start listening ({exited:?}):\n{log}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Proxy {
            child,
            base: format!("http://{address}"),
            dir,
        }
    }

    /// What the proxy logged so far, for a failing assertion.
    #[allow(dead_code)]
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("proxy.log")).unwrap_or_default()
    }
}

fn nginx(dir: &Path, conf: &str) -> Command {
    let conf = conf.replace("worker_processes auto;", "worker_processes 1;");
    let path = dir.join("nginx.conf");
    std::fs::write(&path, conf).unwrap();
    // One process (master_process off): a kill of a master would leave its
    // workers behind, holding the port and the test's output open.
    let globals = format!(
        "daemon off; master_process off; pid {}/nginx.pid; error_log stderr;",
        dir.display()
    );
    let mut command = Command::new("nginx");
    command
        .arg("-p")
        .arg(dir)
        .arg("-c")
        .arg(&path)
        .arg("-g")
        .arg(globals);
    command
}

fn caddy(dir: &Path, conf: &str) -> Command {
    // No admin endpoint (its fixed port would clash between test runs) and
    // no state outside the test's directory.
    let conf = format!("{{\n\tadmin off\n}}\n\n{conf}");
    let path = dir.join("Caddyfile");
    std::fs::write(&path, conf).unwrap();
    let mut command = Command::new("caddy");
    command
        .arg("run")
        .arg("--config")
        .arg(&path)
        .arg("--adapter")
        .arg("caddyfile")
        .env("HOME", dir)
        .env("XDG_DATA_HOME", dir)
        .env("XDG_CONFIG_HOME", dir);
    command
}

fn haproxy(dir: &Path, conf: &str) -> Command {
    let lua = dir.join("narabu.lua");
    std::fs::write(&lua, include_str!("../../config/narabu.lua")).unwrap();
    let conf = conf.replace("/etc/haproxy/narabu.lua", &lua.display().to_string());
    let path = dir.join("haproxy.cfg");
    std::fs::write(&path, conf).unwrap();
    let mut command = Command::new("haproxy");
    // -db: in the foreground, no daemon, so a kill stops it all.
    command.arg("-db").arg("-f").arg(&path);
    command
}

impl Drop for Proxy {
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
