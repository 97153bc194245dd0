//! The admission engine (work in progress; see issue 2).
pub mod settings;
pub use settings::{InvalidRoomId, Order, RoomId, RoomSettings};
