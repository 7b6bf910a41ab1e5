//! The agent runner's context and prompt: what Forgejo says about a work item, and the prompt rendered from it.

pub mod context;
pub mod prompt;
