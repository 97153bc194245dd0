//! Web Push: calling a visitor back when their page is closed.
//!
//! A visitor who asks to be told when their turn comes hands the queue
//! page's push subscription to Narabu ([`Subscription`]); at "N ahead" and
//! at "your turn" the room's owner hands a [`PushMessage`] to the
//! [`PushSender`], which delivers it to the push service the browser named,
//! by the standards alone and with no third party of ours:
//!
//! - [`keys`]: the VAPID key pair (RFC 8292), derived from the instance
//!   secret so every instance signs alike, or loaded from a PEM file; its
//!   public key is what the page subscribes with;
//! - [`ece`]: the `aes128gcm` message encryption (RFC 8291, RFC 8188), so
//!   the push service relays what it cannot read;
//! - [`sender`]: the bounded queue, the few sends at a time, the retries
//!   and the outcome ([`Outcome::Gone`] when the browser has dropped the
//!   subscription), counted in `/metrics`.
//!
//! Nothing here knows rooms or tickets: the engine decides when a message
//! is due and what it says, and keeps the subscription with the ticket.

pub mod ece;
pub mod keys;
pub mod sender;
pub mod subscription;

pub use keys::{VapidError, VapidKey};
pub use sender::{Outcome, PushMessage, PushSender, Receipt, SenderConfig, Urgency};
pub use subscription::{Subscription, SubscriptionError};
