//! The pure heart of Shepherd (DESIGN §2): identities, events, the per-PR record,
//! `step`/`decide`, effects, policy, the command parser and comment texts.
//! No IO and no async here: no tokio, redis, reqwest or actix.
