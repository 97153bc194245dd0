//! The HTTP layer (work in progress; see issue 3): thin handlers over the
//! backend trait, with every route assembled in `router`.
pub mod assets;
pub mod i18n;
pub mod pages;
