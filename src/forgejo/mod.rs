//! Forgejo REST client for exactly the endpoints effects need, with typed errors.
