//! Scenarios about work: (3), (6), (7), (8).
