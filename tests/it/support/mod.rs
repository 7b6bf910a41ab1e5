//! Test support: spawn redis-server on free ports, start Shepherd, a fake Forgejo,
//! signing helpers, and polling with deadlines (never sleeps to wait for results).
