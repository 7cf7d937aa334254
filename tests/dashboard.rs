//! The dashboard in a real headless browser: Debian's Chromium, driven over
//! the WebDriver protocol by its chromedriver (plain HTTP, so the test's
//! HTTP client is the whole driver). The page loads from the server's HTTP
//! address, shows a tube's counts as the text protocol reports them, and
//! its kick button, clicked, kicks the tube's buried job; a screenshot of
//! the page is kept in the target directory. With tokens on, the page asks
//! for one, keeps it for the tab, and says so when a click is refused.
//!
//! `.ci/test` installs `chromium` and `chromium-driver`.

#[macro_use]
#[path = "common/mod.rs"]
mod common;

use std::os::unix::process::CommandExt as _;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{Value, json};

use common::{Backend, TestServer};

backend_tests!(the_page_shows_a_tubes_counts_and_its_kick_button_kicks);

/// The page's status line, once it says something matching `wanted` (a
/// JavaScript regular expression), and only if it is on show as an error.
async fn error_shown(browser: &Browser, what: &str, wanted: &str) -> String {
    let script = format!(
        r#"const s = document.getElementById('status');
           return [s.className === 'error' && s.offsetParent !== null && /{wanted}/.test(s.textContent), s.textContent];"#
    );
    let start = Instant::now();
    loop {
        let got = browser.eval(&script).await;
        let said = got[1].as_str().unwrap_or_default().to_string();
        if got[0] == json!(true) {
            return said;
        }
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "{what}: never; the page says {said:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Clicks the element `css` from within the page, once it is there: the
/// page redraws its buttons at every refresh (the buried job's box is
/// empty while it asks the API), and a WebDriver click between finding a
/// button and clicking it can find it gone.
async fn press(browser: &Browser, css: &str) {
    let script =
        format!("const b = document.querySelector({css:?}); if (b) b.click(); return !!b;");
    browser.until(&format!("{css} to press"), &script).await;
}

/// Types `token` into the page's token field, as a person would finish
/// typing it (the page acts on the field's `change`).
async fn enter_token(browser: &Browser, token: &str) {
    browser
        .eval(&format!(
            r#"const i = document.getElementById('token');
               i.value = {token:?}; i.dispatchEvent(new Event('change')); return true;"#
        ))
        .await;
}

/// With tokens on: the page says it needs a token until it has one; with a
/// worker's token it shows the tubes, and its kick and delete buttons are
/// refused with a message on the page, the jobs untouched; the token is
/// kept across a reload; an admin's token kicks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_tokens_the_page_asks_for_one_and_shows_refusals() {
    let tokens = "work-secret worker\nroot-secret admin\n";
    let config = delayq::config::Config {
        tokens: Some(std::sync::Arc::new(
            delayq::auth::Tokens::parse(tokens).expect("the test tokens"),
        )),
        ..delayq::config::Config::default()
    };
    let server = TestServer::start_full(Backend::Memory, config, true).await;
    let mut c = server.client().await;
    assert_eq!(c.cmd("auth root-secret").await, "AUTHENTICATED");
    c.cmd("use billing").await;
    c.cmd("watch billing").await;
    let id = c.put_ok(0, 0, 60, b"stuck").await;
    c.reserved("reserve-with-timeout 0").await;
    assert_eq!(c.cmd(&format!("bury {id} 0")).await, "BURIED");

    let driver = Driver::start().await;
    let browser = Browser::open(&driver).await;
    let page = format!("{}/?tube=billing", server.http_url());
    browser.go(&page).await;
    let said = error_shown(&browser, "a call for a token", "UNAUTHORIZED.*token").await;
    assert!(!said.contains("cannot reach"), "{said}");

    enter_token(&browser, "work-secret").await;
    let cells = browser
        .until(
            "the tube's row, with a token",
            r#"const r = document.querySelector('tr[data-tube="billing"]');
               return r && r.cells[4].textContent === '1' && !r.querySelector('button.kick').disabled;"#,
        )
        .await;
    assert_eq!(cells, json!(true));
    browser
        .until(
            "the buried job",
            "const p = document.getElementById('buried-job'); return p && p.textContent;",
        )
        .await;

    press(&browser, r#"tr[data-tube="billing"] button.kick"#).await;
    let said = error_shown(&browser, "the kick refused", "kick billing: FORBIDDEN").await;
    assert!(said.contains("admin"), "{said}");
    assert_eq!(c.stats_tube("billing").await.num("current-jobs-buried"), 1);

    // The page asks before it deletes; say yes.
    browser
        .eval("window.confirm = () => true; return true;")
        .await;
    press(&browser, "button.delete-job").await;
    error_shown(
        &browser,
        "the delete refused",
        &format!("delete {id}: FORBIDDEN"),
    )
    .await;
    assert_eq!(c.stats_job(id).await.get("state"), "buried");

    // Kept for the tab: a reload still has it, and works with it.
    browser.go(&page).await;
    let kept = browser
        .eval("return document.getElementById('token').value;")
        .await;
    assert_eq!(kept, json!("work-secret"));
    browser
        .until(
            "the figures after a reload",
            r#"const r = document.querySelector('tr[data-tube="billing"]');
               return r && r.cells[4].textContent === '1';"#,
        )
        .await;

    enter_token(&browser, "root-secret").await;
    browser
        .until(
            "the kick button, with the admin token",
            r#"const b = document.querySelector('tr[data-tube="billing"] button.kick'); return b && !b.disabled;"#,
        )
        .await;
    press(&browser, r#"tr[data-tube="billing"] button.kick"#).await;
    let start = Instant::now();
    while c.stats_tube("billing").await.num("current-jobs-buried") != 0 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the admin's kick kicked nothing"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    browser.close().await;
}

const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
const CHROMIUM: &str = "/usr/bin/chromium";

/// A chromedriver process on a port of its own, killed when dropped with
/// the browsers it started: they share its process group, the driver's
/// own, as a browser whose driver is killed lives on (a failed test left
/// one running, ten processes, until it was killed by hand).
struct Driver {
    child: Child,
    url: String,
}

impl Driver {
    async fn start() -> Driver {
        assert!(
            std::path::Path::new(CHROMEDRIVER).exists() && std::path::Path::new(CHROMIUM).exists(),
            "the dashboard test needs Debian's chromium and chromium-driver (.ci/test installs them)"
        );
        let port = common::ports::free_port();
        let child = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .process_group(0)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let url = format!("http://127.0.0.1:{port}");
        let http = reqwest::Client::new();
        let start = Instant::now();
        while http.get(format!("{url}/status")).send().await.is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "chromedriver never answered"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Driver { child, url }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        // SAFETY: killpg(2) on the group led by our own child, not reaped
        // yet, so the group id is still ours.
        unsafe { libc::killpg(self.child.id() as libc::pid_t, libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

/// One browser session of a driver.
struct Browser {
    http: reqwest::Client,
    session: String,
    _profile: tempfile::TempDir,
}

impl Browser {
    async fn open(driver: &Driver) -> Browser {
        let http = reqwest::Client::new();
        let profile = tempfile::tempdir().expect("a browser profile directory");
        // The flags the machine needs: no sandbox as root, and no
        // background connections to the outside, which the closed network
        // here refuses.
        let args = vec![
            "--headless=new".to_string(),
            "--no-sandbox".into(),
            "--disable-gpu".into(),
            "--disable-dev-shm-usage".into(),
            "--disable-background-networking".into(),
            "--disable-component-update".into(),
            "--disable-sync".into(),
            "--no-first-run".into(),
            "--window-size=1200,800".into(),
            format!("--user-data-dir={}", profile.path().display()),
        ];
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": CHROMIUM, "args": args}
        }}});
        let got: Value = http
            .post(format!("{}/session", driver.url))
            .json(&caps)
            .send()
            .await
            .expect("new session")
            .json()
            .await
            .expect("a JSON answer");
        let session = got["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {got}"))
            .to_string();
        Browser {
            http,
            session: format!("{}/session/{session}", driver.url),
            _profile: profile,
        }
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Value) -> Value {
        let req = self.http.request(method, format!("{}{path}", self.session));
        let req = if body.is_null() { req } else { req.json(&body) };
        let got: Value = req
            .send()
            .await
            .expect("a WebDriver call")
            .json()
            .await
            .expect("JSON");
        got["value"].clone()
    }

    async fn go(&self, url: &str) {
        self.call(reqwest::Method::POST, "/url", json!({ "url": url }))
            .await;
    }

    /// Runs `script` in the page and returns what it returns.
    async fn eval(&self, script: &str) -> Value {
        self.call(
            reqwest::Method::POST,
            "/execute/sync",
            json!({ "script": script, "args": [] }),
        )
        .await
    }

    /// Waits until `script` returns something truthy; returns it.
    async fn until(&self, what: &str, script: &str) -> Value {
        let start = Instant::now();
        loop {
            let got = self.eval(script).await;
            if !(got.is_null() || got == json!(false) || got == json!("")) {
                return got;
            }
            assert!(
                start.elapsed() < Duration::from_secs(15),
                "{what}: never ({got})"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Clicks the element `css` finds. The page rebuilds its table at every
    /// refresh, so the element found may be gone by the time it is clicked
    /// (a loaded CI run lost a kick so: the driver's "stale element
    /// reference" went unread); then it is found again.
    async fn click(&self, css: &str) {
        for _ in 0..20 {
            let found = self
                .call(
                    reqwest::Method::POST,
                    "/element",
                    json!({"using": "css selector", "value": css}),
                )
                .await;
            // An error answer is an object too ({"error": ...}): only the
            // W3C element key names an element.
            let id = found
                .get("element-6066-11e4-a52e-4f735466cecf")
                .and_then(Value::as_str)
                .unwrap_or_else(|| panic!("no element {css}: {found}"))
                .to_string();
            let clicked = self
                .call(
                    reqwest::Method::POST,
                    &format!("/element/{id}/click"),
                    json!({}),
                )
                .await;
            match clicked.get("error").and_then(Value::as_str) {
                None => return,
                Some("stale element reference") => continue,
                Some(_) => panic!("clicking {css}: {clicked}"),
            }
        }
        panic!("{css} went stale 20 times in a row");
    }

    async fn screenshot(&self) -> Vec<u8> {
        let png = self
            .call(reqwest::Method::GET, "/screenshot", Value::Null)
            .await;
        base64::engine::general_purpose::STANDARD
            .decode(png.as_str().expect("a base64 PNG"))
            .expect("valid base64")
    }

    async fn close(self) {
        let _ = self.http.delete(&self.session).send().await;
    }
}

async fn the_page_shows_a_tubes_counts_and_its_kick_button_kicks(backend: Backend) {
    let server = TestServer::start_http(backend).await;
    let mut c = server.client().await;
    c.cmd("use billing").await;
    for body in [b"a".as_slice(), b"b", b"c"] {
        c.put_ok(0, 0, 60, body).await;
    }
    c.put_ok(0, 3600, 60, b"later").await;
    c.cmd("watch billing").await;
    let job = c.reserved("reserve-with-timeout 0").await;
    assert_eq!(c.cmd(&format!("bury {} 0", job.id)).await, "BURIED");
    let counts = c.stats_tube("billing").await;
    assert_eq!(
        (
            counts.num("current-jobs-ready"),
            counts.num("current-jobs-delayed"),
            counts.num("current-jobs-buried")
        ),
        (2, 1, 1)
    );

    let driver = Driver::start().await;
    let browser = Browser::open(&driver).await;
    browser
        .go(&format!("{}/?tube=billing", server.http_url()))
        .await;
    // ready, delayed, reserved, buried: the page's cells for the tube.
    let cells = browser
        .until(
            "the tube's row",
            r#"const r = document.querySelector('tr[data-tube="billing"]');
               return r && r.cells[1].textContent !== '' ? Array.from(r.cells).slice(1, 5).map(c => c.textContent) : null;"#,
        )
        .await;
    assert_eq!(cells, json!(["2", "1", "0", "1"]));
    browser
        .until(
            "the buried job",
            "const p = document.getElementById('buried-job'); return p && p.textContent;",
        )
        .await;
    let png = browser.screenshot().await;
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "a PNG screenshot");
    let shot = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("dashboard-{backend:?}.png"));
    std::fs::write(&shot, &png).expect("keep the screenshot");

    browser
        .click(r#"tr[data-tube="billing"] button.kick"#)
        .await;
    let start = Instant::now();
    loop {
        let s = c.stats_tube("billing").await;
        if s.num("current-jobs-buried") == 0 {
            assert_eq!(s.num("current-jobs-ready"), 3);
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the kick button kicked nothing"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The page shows it by itself at its next refresh.
    browser
        .until(
            "the kicked job shown as ready",
            r#"const r = document.querySelector('tr[data-tube="billing"]');
               return r && r.cells[1].textContent === '3' && r.cells[4].textContent === '0';"#,
        )
        .await;
    browser.close().await;
}
