//! A browser's push subscription, in the shape `PushSubscription.toJSON()`
//! gives it: `{endpoint, expirationTime, keys: {p256dh, auth}}`.
//!
//! It is checked when it is parsed, so a bad one is refused with a clear
//! reason where it arrives rather than failing later at a send. The
//! endpoint is a capability URL (anyone holding it can push to the
//! browser) and the keys decrypt the messages, so neither the keys nor the
//! endpoint's path ever reach a log: `Debug` shows the push service's
//! origin only.

use std::fmt;

use base64::Engine as _;
use base64::alphabet::URL_SAFE;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use p256::PublicKey;
use p256::elliptic_curve::sec1::ToEncodedPoint as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use url::Url;

/// Browsers send base64url without padding; some libraries add it.
const LENIENT_B64: GeneralPurpose = GeneralPurpose::new(
    &URL_SAFE,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);
/// Endpoint URLs seen in the wild are under 600 bytes; this only stops a
/// client from parking a large string in a ticket's state.
const MAX_ENDPOINT_LEN: usize = 2048;

/// Why a subscription was refused; safe to show the visitor.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum SubscriptionError {
    #[error("the subscription is not valid JSON of the PushSubscription shape: {0}")]
    Shape(String),
    #[error("`endpoint` is not an absolute URL")]
    EndpointUrl,
    #[error("`endpoint` must be an https: URL")]
    EndpointScheme,
    #[error("`endpoint` must name a push service by host name, not an address")]
    EndpointHost,
    #[error("`endpoint` is longer than {MAX_ENDPOINT_LEN} bytes")]
    EndpointLength,
    #[error("`keys.{0}` is not base64url")]
    Base64(&'static str),
    #[error("`keys.p256dh` must be a 65-byte uncompressed P-256 point, got {0} bytes")]
    P256dhLength(usize),
    #[error("`keys.p256dh` is not a point on P-256")]
    P256dhPoint,
    #[error("`keys.auth` must be 16 bytes, got {0}")]
    AuthLength(usize),
}

/// A checked push subscription.
#[derive(Clone, PartialEq, Eq)]
pub struct Subscription {
    endpoint: Url,
    /// Milliseconds since the epoch, when the browser gives one.
    expiration_time: Option<u64>,
    p256dh: PublicKey,
    auth: [u8; 16],
}

impl fmt::Debug for Subscription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subscription")
            .field("push_service", &self.push_service())
            .field("expiration_time", &self.expiration_time)
            .finish_non_exhaustive()
    }
}

/// The wire form, before checking.
#[derive(Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
struct Wire {
    endpoint: String,
    #[serde(default)]
    expiration_time: Option<f64>,
    keys: WireKeys,
}

#[derive(Deserialize, Serialize)]
struct WireKeys {
    p256dh: String,
    auth: String,
}

impl Subscription {
    /// Parses and checks a subscription as the page sends it. An `http:`
    /// endpoint, or one naming an IP address or `localhost`, is refused
    /// unless `allow_insecure` (tests, which play the push service
    /// locally): the endpoint is the visitor's to choose, so Narabu must
    /// not be made to POST into its own network.
    pub fn from_json(json: &[u8], allow_insecure: bool) -> Result<Self, SubscriptionError> {
        let wire: Wire =
            serde_json::from_slice(json).map_err(|e| SubscriptionError::Shape(e.to_string()))?;
        let sub = Self::from_wire(wire)?;
        sub.check_endpoint(allow_insecure)?;
        Ok(sub)
    }

    fn from_wire(w: Wire) -> Result<Self, SubscriptionError> {
        if w.endpoint.len() > MAX_ENDPOINT_LEN {
            return Err(SubscriptionError::EndpointLength);
        }
        let endpoint = Url::parse(&w.endpoint).map_err(|_| SubscriptionError::EndpointUrl)?;
        if !matches!(endpoint.scheme(), "https" | "http") || endpoint.host().is_none() {
            return Err(SubscriptionError::EndpointScheme);
        }
        let p256dh = LENIENT_B64
            .decode(w.keys.p256dh.trim())
            .map_err(|_| SubscriptionError::Base64("p256dh"))?;
        if p256dh.len() != 65 || p256dh[0] != 4 {
            return Err(SubscriptionError::P256dhLength(p256dh.len()));
        }
        let p256dh =
            PublicKey::from_sec1_bytes(&p256dh).map_err(|_| SubscriptionError::P256dhPoint)?;
        let auth = LENIENT_B64
            .decode(w.keys.auth.trim())
            .map_err(|_| SubscriptionError::Base64("auth"))?;
        let auth: [u8; 16] = auth
            .as_slice()
            .try_into()
            .map_err(|_| SubscriptionError::AuthLength(auth.len()))?;
        let expiration_time = w
            .expiration_time
            .filter(|t| t.is_finite() && *t >= 0.0)
            .map(|t| t as u64);
        Ok(Self {
            endpoint,
            expiration_time,
            p256dh,
            auth,
        })
    }

    /// Refuses the endpoints a production sender must not reach; see
    /// [`Subscription::from_json`].
    pub(crate) fn check_endpoint(&self, allow_insecure: bool) -> Result<(), SubscriptionError> {
        if allow_insecure {
            return Ok(());
        }
        if self.endpoint.scheme() != "https" {
            return Err(SubscriptionError::EndpointScheme);
        }
        // A name resolving to an internal address is the sender's to
        // refuse (`super::resolve`); these are plain without a lookup. A
        // final dot names the same host.
        match self.endpoint.host() {
            Some(url::Host::Domain(d)) => {
                let d = d.trim_end_matches('.').to_ascii_lowercase();
                if d.is_empty() || d == "localhost" || d.ends_with(".localhost") {
                    Err(SubscriptionError::EndpointHost)
                } else {
                    Ok(())
                }
            }
            _ => Err(SubscriptionError::EndpointHost),
        }
    }

    pub(crate) fn endpoint(&self) -> &Url {
        &self.endpoint
    }

    /// The push service's origin (`https://fcm.googleapis.com`), the one
    /// part of the endpoint fit for logs and metrics.
    pub(crate) fn push_service(&self) -> String {
        self.endpoint.origin().ascii_serialization()
    }

    pub(crate) fn expiration_time(&self) -> Option<u64> {
        self.expiration_time
    }

    pub(crate) fn p256dh(&self) -> &PublicKey {
        &self.p256dh
    }

    pub(crate) fn auth(&self) -> &[u8; 16] {
        &self.auth
    }
}

impl<'de> Deserialize<'de> for Subscription {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Subscription::from_wire(Wire::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

/// Written back in the browser's shape, so a stored subscription reads
/// back through the same checks.
impl Serialize for Subscription {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        Wire {
            endpoint: self.endpoint.to_string(),
            expiration_time: self.expiration_time.map(|t| t as f64),
            keys: WireKeys {
                p256dh: URL_SAFE_NO_PAD.encode(self.p256dh.to_encoded_point(false).as_bytes()),
                auth: URL_SAFE_NO_PAD.encode(self.auth),
            },
        }
        .serialize(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// RFC 8291 Appendix A's subscription keys.
    const P256DH: &str =
        "BCVxsr7N_eNgVRqvHtD0zTZsEc6-VV-JvLexhqUzORcxaOzi6-AYWXvTBHm4bjyPjs7Vd8pZGH6SRpkNtoIAiw4";
    const AUTH: &str = "BTBZMqHH6r4Tts7J_aSIgg";
    const ENDPOINT: &str = "https://fcm.googleapis.com/fcm/send/dQw4w9WgXcQ:APA91bSECRETPATH";

    fn parse(v: serde_json::Value) -> Result<Subscription, SubscriptionError> {
        Subscription::from_json(v.to_string().as_bytes(), false)
    }

    fn with(endpoint: &str, p256dh: &str, auth: &str) -> serde_json::Value {
        json!({"endpoint": endpoint, "expirationTime": null, "keys": {"p256dh": p256dh, "auth": auth}})
    }

    #[test]
    fn a_browsers_subscription_parses_and_round_trips() {
        let sub = parse(with(ENDPOINT, P256DH, AUTH)).unwrap();
        assert_eq!(sub.endpoint().as_str(), ENDPOINT);
        assert_eq!(sub.push_service(), "https://fcm.googleapis.com");
        assert_eq!(sub.expiration_time(), None);
        let back = serde_json::to_value(&sub).unwrap();
        assert_eq!(back, with(ENDPOINT, P256DH, AUTH));
        // Padded base64 and an expiration time are accepted too.
        let padded = json!({"endpoint": ENDPOINT, "expirationTime": 1_900_000_000_000u64,
            "keys": {"p256dh": format!("{P256DH}="), "auth": format!("{AUTH}==")}});
        let sub2 = parse(padded).unwrap();
        assert_eq!(sub2.expiration_time(), Some(1_900_000_000_000));
        assert_eq!(sub2.auth(), sub.auth());
    }

    #[test]
    fn bad_subscriptions_are_refused_with_their_reason() {
        use SubscriptionError::*;
        let cases = [
            (with("not a url", P256DH, AUTH), EndpointUrl),
            (
                with("ftp://push.example.com/x", P256DH, AUTH),
                EndpointScheme,
            ),
            (
                with("http://push.example.com/x", P256DH, AUTH),
                EndpointScheme,
            ),
            (with("https://127.0.0.1/x", P256DH, AUTH), EndpointHost),
            (with("https://[::1]/x", P256DH, AUTH), EndpointHost),
            (with("https://localhost/x", P256DH, AUTH), EndpointHost),
            (with("https://LocalHost./x", P256DH, AUTH), EndpointHost),
            (with("https://app.localhost./x", P256DH, AUTH), EndpointHost),
            (
                with(
                    &format!("https://a.example/{}", "x".repeat(3000)),
                    P256DH,
                    AUTH,
                ),
                EndpointLength,
            ),
            (with(ENDPOINT, "not*base64", AUTH), Base64("p256dh")),
            (with(ENDPOINT, P256DH, "not*base64"), Base64("auth")),
            (with(ENDPOINT, &P256DH[..40], AUTH), P256dhLength(30)),
            (with(ENDPOINT, P256DH, "AAAA"), AuthLength(3)),
        ];
        for (json, want) in cases {
            assert_eq!(parse(json.clone()).unwrap_err(), want, "{json}");
        }
        // 65 bytes starting 0x04 but not on the curve.
        let off_curve = URL_SAFE_NO_PAD.encode([4u8; 65]);
        assert_eq!(
            parse(with(ENDPOINT, &off_curve, AUTH)).unwrap_err(),
            P256dhPoint
        );
        match parse(json!({"endpoint": ENDPOINT})).unwrap_err() {
            Shape(why) => assert!(why.contains("keys"), "{why}"),
            other => panic!("{other:?}"),
        }
        // Tests may play the push service on a local http: address.
        let local = with("http://127.0.0.1:9/push/1", P256DH, AUTH);
        assert!(Subscription::from_json(local.to_string().as_bytes(), true).is_ok());
    }

    #[test]
    fn debug_shows_neither_keys_nor_the_endpoints_path() {
        let sub = parse(with(ENDPOINT, P256DH, AUTH)).unwrap();
        let printed = format!("{sub:?}");
        assert!(printed.contains("https://fcm.googleapis.com"), "{printed}");
        for secret in ["SECRETPATH", "dQw4w9WgXcQ", &P256DH[..20], AUTH] {
            assert!(!printed.contains(secret), "{printed}");
        }
        // Nor do errors, which name the field only.
        let e = parse(with(ENDPOINT, P256DH, "AAAA")).unwrap_err();
        assert!(!format!("{e} {e:?}").contains("SECRETPATH"));
    }
}
