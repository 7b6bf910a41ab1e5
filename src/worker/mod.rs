//! Workers: event consumer, effect executor, timers, periodic resync.
