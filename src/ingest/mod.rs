//! HTTP edge: the actix-web app (webhooks, health, metrics), signature verification.
