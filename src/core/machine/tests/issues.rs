//! issues
