//! walks
