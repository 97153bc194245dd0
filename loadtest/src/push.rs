//! The push service `surge --subscribe-share` plays on loopback.
//!
//! A subscribing visitor makes a real Web Push subscription (a fresh P-256
//! key pair and a 16-byte auth secret, as a browser would) whose endpoint
//! is this sink, `http://127.0.0.1:PORT/push/I`. The server must be told it
//! may send to such an endpoint (`[push] allow_insecure_endpoints = true`,
//! off by default). The sink answers `201` to every push, as a push service
//! does, tells the visitor when its "turn" message arrives (the one sent
//! with `Urgency: high`), and counts what came: every message, and for a
//! sample, the body decrypted with the subscriber's private key (RFC 8291)
//! and the VAPID header verified (RFC 8292), so the figures are of real,
//! readable pushes and not of bytes. Decrypting every message would cost
//! the tool about what encrypting costs the server, on the same cores.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use aes_gcm::aead::{Aead, KeyInit};
use aes_gcm::{Aes128Gcm, Nonce};
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use hkdf::Hkdf;
use p256::ecdsa::signature::Verifier as _;
use p256::ecdsa::{Signature, VerifyingKey};
use p256::elliptic_curve::sec1::ToEncodedPoint as _;
use p256::{PublicKey, SecretKey};
use serde_json::{Value, json};
use sha2::Sha256;
use tokio::sync::oneshot;
use tokio::time::Instant;

/// `salt(16) | rs(4) | idlen(1) | keyid(65)` before the record.
const HEADER_LEN: usize = 16 + 4 + 1 + 65;

/// One subscriber's keys and where its turn is reported.
struct Slot {
    secret: SecretKey,
    auth: [u8; 16],
    number: u64,
    turn: Option<oneshot::Sender<f64>>,
    turns: u32,
}

/// What the sink saw, for the report.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct SinkSeen {
    pub received: u64,
    pub turns: u64,
    pub aheads: u64,
    /// Turn messages beyond the first to one subscriber.
    pub repeated_turns: u64,
    /// Messages decrypted and read, and VAPID headers verified, of the
    /// sample.
    pub decrypted: u64,
    pub vapid_verified: u64,
    /// Why a sampled message did not check out, by reason.
    pub bad: BTreeMap<String, u64>,
    /// Seconds from the start to the first and last push.
    pub first_s: Option<f64>,
    pub last_s: Option<f64>,
}

impl SinkSeen {
    /// Pushes per second over the span they arrived in.
    pub fn per_second(&self) -> f64 {
        match (self.first_s, self.last_s) {
            (Some(a), Some(b)) if b > a => self.received as f64 / (b - a),
            _ => 0.0,
        }
    }
}

struct Shared {
    start: Instant,
    origin: String,
    room: String,
    /// The application server key the room gave its subscribers.
    vapid_key: String,
    decrypt_every: u64,
    slots: Mutex<HashMap<usize, Slot>>,
    received: AtomicU64,
    seen: Mutex<SinkSeen>,
}

/// The running sink; dropping it stops serving.
pub struct PushSink {
    shared: Arc<Shared>,
    _stop: oneshot::Sender<()>,
}

impl PushSink {
    /// Serves on a free loopback port. `vapid_key` is the room's key
    /// (`GET /api/rooms/{room}/notify`); one message in `decrypt_every` is
    /// decrypted and its VAPID header verified.
    pub async fn start(
        start: Instant,
        room: &str,
        vapid_key: String,
        decrypt_every: u64,
    ) -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr: SocketAddr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            start,
            origin: format!("http://{addr}"),
            room: room.to_owned(),
            vapid_key,
            decrypt_every: decrypt_every.max(1),
            slots: Mutex::new(HashMap::new()),
            received: AtomicU64::new(0),
            seen: Mutex::new(SinkSeen::default()),
        });
        let app = Router::new()
            .route("/push/{i}", post(receive))
            .with_state(shared.clone());
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await;
        });
        Ok(Self {
            shared,
            _stop: stop,
        })
    }

    /// A new subscription for visitor `i` holding ticket `number`, in the
    /// shape `PushSubscription.toJSON()` gives, and where its turn message
    /// will be announced (seconds from the start).
    pub fn subscribe(&self, i: usize, number: u64) -> (Value, oneshot::Receiver<f64>) {
        let secret = loop {
            // Any 32 bytes but for odds of 2^-32 are a valid scalar.
            if let Ok(key) = SecretKey::from_slice(&rand::random::<[u8; 32]>()) {
                break key;
            }
        };
        let auth: [u8; 16] = rand::random();
        let p256dh = B64.encode(secret.public_key().to_encoded_point(false).as_bytes());
        let subscription = json!({
            "endpoint": format!("{}/push/{i}", self.shared.origin),
            "expirationTime": null,
            "keys": {"p256dh": p256dh, "auth": B64.encode(auth)},
        });
        let (tx, rx) = oneshot::channel();
        lock(&self.shared.slots).insert(
            i,
            Slot {
                secret,
                auth,
                number,
                turn: Some(tx),
                turns: 0,
            },
        );
        (subscription, rx)
    }

    pub fn seen(&self) -> SinkSeen {
        lock(&self.shared.seen).clone()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

async fn receive(
    State(shared): State<Arc<Shared>>,
    Path(i): Path<usize>,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    let at = shared.start.elapsed().as_secs_f64();
    let n = shared.received.fetch_add(1, Ordering::Relaxed);
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let turn = header("urgency") == Some("high");
    let sample = n % shared.decrypt_every == 0;
    let (keys, repeated) = {
        let mut slots = lock(&shared.slots);
        match slots.get_mut(&i) {
            Some(slot) => {
                if turn {
                    slot.turns += 1;
                    if let Some(tx) = slot.turn.take() {
                        let _ = tx.send(at);
                    }
                }
                let keys = sample.then(|| (slot.secret.clone(), slot.auth, slot.number));
                (Some(keys), slot.turns > 1)
            }
            None => (None, false),
        }
    };
    let checked = match keys {
        None => Some(Err("a push to no subscriber".to_owned())),
        Some(None) => None,
        Some(Some((secret, auth, number))) => Some(check(
            &shared, &headers, &body, &secret, &auth, number, turn,
        )),
    };
    let mut seen = lock(&shared.seen);
    seen.received += 1;
    seen.first_s = Some(seen.first_s.map_or(at, |f| f.min(at)));
    seen.last_s = Some(seen.last_s.map_or(at, |l| l.max(at)));
    if turn {
        seen.turns += 1;
    } else {
        seen.aheads += 1;
    }
    if repeated {
        seen.repeated_turns += 1;
    }
    match checked {
        Some(Ok(())) => {
            seen.decrypted += 1;
            seen.vapid_verified += 1;
        }
        Some(Err(why)) => *seen.bad.entry(why).or_default() += 1,
        None => {}
    }
    StatusCode::CREATED
}

/// A sampled message: its VAPID header and its decrypted text.
fn check(
    shared: &Shared,
    headers: &HeaderMap,
    body: &[u8],
    secret: &SecretKey,
    auth: &[u8; 16],
    number: u64,
    turn: bool,
) -> Result<(), String> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if header("content-encoding") != Some("aes128gcm") {
        return Err("Content-Encoding is not aes128gcm".into());
    }
    if header("ttl").and_then(|t| t.parse::<u64>().ok()).is_none() {
        return Err("no TTL".into());
    }
    verify_vapid(header("authorization").unwrap_or(""), shared)?;
    let text = decrypt(body, secret, auth).ok_or("not decryptable with the subscriber's key")?;
    let message: Value = serde_json::from_slice(&text).map_err(|_| "decrypted text is not JSON")?;
    let kind = if turn { "turn" } else { "ahead" };
    if message["kind"] != kind {
        return Err(format!("Urgency says {kind}, the text says otherwise"));
    }
    if message["number"] != number || message["room"] != shared.room.as_str() {
        return Err("the text names another ticket or room".into());
    }
    if message["title"].as_str().is_none_or(str::is_empty) {
        return Err("the text has no title".into());
    }
    Ok(())
}

/// RFC 8292: `vapid t=JWT, k=KEY`, the key the room gave, a valid ES256
/// signature, this push service as the audience, not expired.
fn verify_vapid(authorization: &str, shared: &Shared) -> Result<(), String> {
    let rest = authorization
        .strip_prefix("vapid ")
        .ok_or("Authorization is not vapid")?;
    let mut token = None;
    let mut key = None;
    for part in rest.split(',') {
        match part.trim().split_once('=') {
            Some(("t", v)) => token = Some(v),
            Some(("k", v)) => key = Some(v),
            _ => {}
        }
    }
    let (token, key) = token.zip(key).ok_or("vapid header lacks t or k")?;
    if key != shared.vapid_key {
        return Err("vapid k is not the room's key".into());
    }
    let (signed, signature) = token.rsplit_once('.').ok_or("JWT is not three parts")?;
    let verifier = B64
        .decode(key)
        .ok()
        .and_then(|k| VerifyingKey::from_sec1_bytes(&k).ok())
        .ok_or("vapid k is not a P-256 key")?;
    let signature = B64
        .decode(signature)
        .ok()
        .and_then(|s| Signature::from_slice(&s).ok())
        .ok_or("JWT signature is not ES256")?;
    verifier
        .verify(signed.as_bytes(), &signature)
        .map_err(|_| "JWT signature does not verify")?;
    let claims = signed
        .split_once('.')
        .and_then(|(_, c)| B64.decode(c).ok())
        .and_then(|c| serde_json::from_slice::<Value>(&c).ok())
        .ok_or("JWT claims unreadable")?;
    if claims["aud"] != shared.origin.as_str() {
        return Err("JWT aud is not this push service".into());
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    if claims["exp"].as_u64().is_none_or(|exp| exp <= now) {
        return Err("JWT expired".into());
    }
    Ok(())
}

/// RFC 8291 and RFC 8188, the browser's side: one record.
fn decrypt(body: &[u8], secret: &SecretKey, auth: &[u8; 16]) -> Option<Vec<u8>> {
    if body.len() <= HEADER_LEN || body[20] != 65 {
        return None;
    }
    let salt = &body[..16];
    let server_key = &body[21..HEADER_LEN];
    let server = PublicKey::from_sec1_bytes(server_key).ok()?;
    let shared = p256::ecdh::diffie_hellman(secret.to_nonzero_scalar(), server.as_affine());
    let mut info = b"WebPush: info\0".to_vec();
    info.extend_from_slice(secret.public_key().to_encoded_point(false).as_bytes());
    info.extend_from_slice(server_key);
    let mut ikm = [0u8; 32];
    Hkdf::<Sha256>::new(Some(auth), shared.raw_secret_bytes())
        .expand(&info, &mut ikm)
        .ok()?;
    let prk = Hkdf::<Sha256>::new(Some(salt), &ikm);
    let (mut cek, mut nonce) = ([0u8; 16], [0u8; 12]);
    prk.expand(b"Content-Encoding: aes128gcm\0", &mut cek)
        .ok()?;
    prk.expand(b"Content-Encoding: nonce\0", &mut nonce).ok()?;
    let mut record = Aes128Gcm::new(&cek.into())
        .decrypt(Nonce::from_slice(&nonce), &body[HEADER_LEN..])
        .ok()?;
    // The last record ends with a 2 and any padding of zeros before it.
    while record.last() == Some(&0) {
        record.pop();
    }
    (record.pop() == Some(2)).then_some(record)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 8291 Appendix A: the message as a browser receives it.
    #[test]
    fn the_rfcs_example_decrypts() {
        let secret = SecretKey::from_slice(
            &B64.decode("q1dXpw3UpT5VOmu_cf_v6ih07Aems3njxI-JWgLcM94")
                .unwrap(),
        )
        .unwrap();
        let auth: [u8; 16] = B64
            .decode("BTBZMqHH6r4Tts7J_aSIgg")
            .unwrap()
            .try_into()
            .unwrap();
        let body = B64.decode("DGv6ra1nlYgDCS1FRnbzlwAAEABBBP4z9KsN6nGRTbVYI_c7VJSPQTBtkgcy27mlmlMoZIIgDll6e3vCYLocInmYWAmS6TlzAC8wEqKK6PBru3jl7A_yl95bQpu6cVPTpK4Mqgkf1CXztLVBSt2Ks3oZwbuwXPXLWyouBWLVWGNWQexSgSxsj_Qulcy4a-fN").unwrap();
        assert_eq!(
            decrypt(&body, &secret, &auth).unwrap(),
            b"When I grow up, I want to be a watermelon"
        );
        let mut wrong = auth;
        wrong[0] ^= 1;
        assert_eq!(decrypt(&body, &secret, &wrong), None);
    }
}
