//! Redis: keys, Lua scripts, streams, compare-and-set commits, timers and the archive.
//! Everything that touches Redis lives under this module.

pub mod keys;

pub use keys::Keys;
