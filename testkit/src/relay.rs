//! A loopback TCP relay a test puts between a client (a browser) and the
//! server, to do what networks do to long-lived connections: [`Relay::cut`]
//! drops every connection through it at once and holds new ones until
//! [`Relay::reopen`]. It keeps the first bytes each client sent (its
//! request head), so a test can see what a client asked on reconnecting.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct Relay {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    accept: tokio::task::JoinHandle<()>,
}

struct Shared {
    upstream: SocketAddr,
    /// Whether new connections go through.
    open: watch::Sender<bool>,
    /// Moves on every cut; each connection ends when it does.
    cuts: watch::Sender<u64>,
    heads: Mutex<Vec<String>>,
}

impl Relay {
    /// A relay on a free loopback port to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared {
            upstream,
            open: watch::Sender::new(true),
            cuts: watch::Sender::new(0),
            heads: Mutex::new(Vec::new()),
        });
        let s = shared.clone();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(relay(client, s.clone()));
            }
        });
        Self {
            addr,
            shared,
            accept,
        }
    }

    /// Drop every connection now; hold new ones until `reopen`.
    pub fn cut(&self) {
        self.shared.open.send_replace(false);
        self.shared.cuts.send_modify(|n| *n += 1);
    }

    pub fn reopen(&self) {
        self.shared.open.send_replace(true);
    }

    /// The first bytes of every connection so far, as text.
    pub fn heads(&self) -> Vec<String> {
        self.shared.heads.lock().unwrap().clone()
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

async fn relay(mut client: TcpStream, shared: Arc<Shared>) {
    let mut cuts = shared.cuts.subscribe();
    cuts.borrow_and_update();
    let mut open = shared.open.subscribe();
    let admitted = async {
        let _ = open.wait_for(|o| *o).await;
        TcpStream::connect(shared.upstream).await.ok()
    };
    let mut server = tokio::select! {
        s = admitted => match s { Some(s) => s, None => return },
        _ = cuts.changed() => return,
    };
    let mut first = vec![0u8; 4096];
    let n = tokio::select! {
        n = client.read(&mut first) => n.unwrap_or(0),
        _ = cuts.changed() => return,
    };
    if n == 0 {
        return;
    }
    shared
        .heads
        .lock()
        .unwrap()
        .push(String::from_utf8_lossy(&first[..n]).into_owned());
    if server.write_all(&first[..n]).await.is_err() {
        return;
    }
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
        _ = cuts.changed() => {}
    }
}
