//! The HTTP dispatch sink (DESIGN §4): work items and cancel notices POSTed signed with
//! `X-Shepherd-Signature`, retried after a transient failure without appending the
//! work item to the dispatch stream twice.

use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::{BOT_MARKER, REPO};
use crate::support::fake_forgejo::NewPr;
use crate::support::poll_until_named;
use crate::support::scenario::{DEADLINE, Scenario};

/// The dispatch secret of these scenarios.
const SECRET: &str = "dispatch-secret-for-tests";

/// One request the receiver got: (signature, event header, body).
type Received = (String, String, Vec<u8>);

/// A receiving agent runner: records every POST; answers 503 to the first one.
struct Receiver {
    /// Requests so far.
    got: Arc<Mutex<Vec<Received>>>,
    /// Its URL.
    url: String,
    /// The server.
    _handle: actix_web::dev::ServerHandle,
}

impl Receiver {
    fn start() -> Self {
        let got: Arc<Mutex<Vec<Received>>> = Arc::default();
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}/work", listener.local_addr().expect("addr"));
        let data = web::Data::new(got.clone());
        let server = HttpServer::new(move || {
            App::new()
                .app_data(data.clone())
                .default_service(web::to(receive))
        })
        .workers(1)
        .disable_signals()
        .listen(listener)
        .expect("listen")
        .run();
        let handle = server.handle();
        tokio::spawn(server);
        Self {
            got,
            url,
            _handle: handle,
        }
    }

    fn received(&self) -> Vec<Received> {
        self.got.lock().unwrap().clone()
    }
}

async fn receive(
    req: HttpRequest,
    body: web::Bytes,
    got: web::Data<Arc<Mutex<Vec<Received>>>>,
) -> HttpResponse {
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned()
    };
    let mut got = got.lock().unwrap();
    got.push((
        header("x-shepherd-signature"),
        header("x-shepherd-event"),
        body.to_vec(),
    ));
    match got.len() {
        1 => HttpResponse::ServiceUnavailable().finish(),
        _ => HttpResponse::Ok().finish(),
    }
}

/// `sha256=<hex HMAC-SHA256>` of `body`.
fn expected_signature(body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(SECRET.as_bytes()).unwrap();
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// A work item reaches the stream once and the HTTP sink signed, after a 503; closing
/// the PR sends a signed cancel notice on both sinks.
#[tokio::test(flavor = "multi_thread")]
async fn scenario_http_dispatch_is_signed_and_retried() {
    let receiver = Receiver::start();
    let env = [
        ("SHEPHERD_DISPATCH_URL", receiver.url.as_str()),
        ("SHEPHERD_DISPATCH_SECRET", SECRET),
    ];
    let s = Scenario::start_with_env("", &env).await;
    let fake = &s.fake;
    let body = format!("Adds t.\n\n{BOT_MARKER}");
    let n = fake.open_pr(REPO, NewPr::new("agent-bot", "Add t").body(&body));
    let sha = fake.head_sha(REPO, n);
    fake.set_status(REPO, &sha, "ci/test", "failure", "red");
    s.send(&fake.pr_opened(REPO, n)).await;
    poll_until_named(
        DEADLINE,
        "the work item is POSTed again after a 503",
        || async { receiver.received().len() >= 2 },
    )
    .await;
    let items = s.work_items().await;
    assert_eq!(items.len(), 1, "appended to the stream once");
    for (signature, event, body) in receiver.received() {
        assert_eq!(signature, expected_signature(&body));
        assert_eq!(event, "work");
        let posted: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            posted, items[0],
            "the stream and the POST carry the same item"
        );
    }

    fake.close(REPO, n);
    s.send(&fake.pr_closed(REPO, n, "alice")).await;
    poll_until_named(DEADLINE, "a cancel notice is POSTed", || async {
        receiver.received().iter().any(|(_, e, _)| e == "cancel")
    })
    .await;
    s.wait_idle().await;
    let cancels = s.cancels().await;
    assert_eq!(cancels.len(), 1);
    assert_eq!(cancels[0]["id"], items[0]["id"]);
    let got = receiver.received();
    let (signature, _, body) = got.iter().find(|(_, e, _)| e == "cancel").unwrap();
    assert_eq!(*signature, expected_signature(body));
    let notice: serde_json::Value = serde_json::from_slice(body).unwrap();
    assert_eq!(notice, cancels[0]);
    assert_eq!(got.len(), 3, "work (503), work, cancel");
}
