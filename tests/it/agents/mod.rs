//! The agents' context and prompt against the fake Forgejo, and the real opencode CLI
//! against a stub model server.

mod context;
mod opencode;
