//! Client-chosen job ids and `finish`.

use crate::common::{Backend, TestServer};
use crate::support::OID;

backend_tests!(
    client_id_put_and_exists_in_every_state,
    client_ids_are_global_across_tubes,
    invalid_client_ids_are_bad_format,
    client_id_of_200_bytes_and_every_allowed_character,
    every_id_command_takes_a_client_id,
    digit_ids_never_name_client_id_jobs,
    unknown_client_id_is_not_found,
    finish_only_for_a_job_reserved_here,
);

async fn client_id_put_and_exists_in_every_state(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let exists = format!("EXISTS {OID}");
    assert_eq!(
        c.put_id(5, 0, 100, b"first", OID).await,
        format!("INSERTED {OID}")
    );
    // ready
    assert_eq!(c.put_id(1, 0, 100, b"second", OID).await, exists);
    // reserved
    let job = c.reserve_body().await;
    assert_eq!((job.id.as_str(), &job.body[..]), (OID, &b"first"[..]));
    assert_eq!(c.put_id(1, 0, 100, b"second", OID).await, exists);
    // delayed
    assert_eq!(c.cmd(&format!("release {OID} 5 100")).await, "RELEASED");
    assert_eq!(c.put_id(1, 0, 100, b"second", OID).await, exists);
    // buried
    c.reserved(&format!("reserve-job {OID}")).await;
    assert_eq!(c.cmd(&format!("bury {OID} 5")).await, "BURIED");
    assert_eq!(c.put_id(1, 0, 100, b"second", OID).await, exists);
    // Nothing changed.
    let job = c.found(&format!("peek {OID}")).await;
    assert_eq!((job.id.as_str(), &job.body[..]), (OID, &b"first"[..]));
    let s = c.stats_job(OID).await;
    assert_eq!(
        (s.get("state"), s.num("pri"), s.num("ttr")),
        ("buried", 5, 100)
    );
    let s = c.stats().await;
    assert_eq!((s.num("total-jobs"), s.num("current-jobs-buried")), (1, 1));
    assert_eq!(
        s.num("current-jobs-ready") + s.num("current-jobs-delayed"),
        0
    );
    // Once the job is gone the id is free again.
    assert_eq!(c.cmd(&format!("delete {OID}")).await, "DELETED");
    assert_eq!(
        c.put_id(1, 0, 100, b"third", OID).await,
        format!("INSERTED {OID}")
    );
    assert_eq!(c.reserve_body().await.body, b"third");
}

async fn client_ids_are_global_across_tubes(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut a = server.client().await;
    let mut b = server.client().await;
    assert_eq!(a.put_id(0, 0, 60, b"x", "job:1").await, "INSERTED job:1");
    b.cmd("use other").await;
    assert_eq!(b.put_id(0, 0, 60, b"y", "job:1").await, "EXISTS job:1");
    assert_eq!(b.stats_job("job:1").await.get("tube"), "default");
    assert!(b.cmd("list-tube-used").await.ends_with("other"));
}

async fn invalid_client_ids_are_bad_format(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let long = "a".repeat(201);
    for id in [
        "-abc",
        "4711",
        "0",
        long.as_str(),
        "a#b",
        "a,b",
        "a\"b",
        "caf\u{e9}",
        "a*",
    ] {
        c.send(format!("put 0 0 60 5 {id}\r\nhello\r\n").as_bytes())
            .await;
        assert_eq!(c.line().await, "BAD_FORMAT", "id {id:?}");
        // As in beanstalkd, the body line is then read as a command.
        assert_eq!(c.line().await, "UNKNOWN_COMMAND", "body after id {id:?}");
    }
    // Two ids, or a trailing space, are malformed too.
    for line in ["put 0 0 60 5 a b", "put 0 0 60 5 a "] {
        c.send(format!("{line}\r\nhello\r\n").as_bytes()).await;
        assert_eq!(c.line().await, "BAD_FORMAT", "{line:?}");
        assert_eq!(c.line().await, "UNKNOWN_COMMAND");
    }
    assert_eq!(c.stats().await.num("total-jobs"), 0);
}

async fn client_id_of_200_bytes_and_every_allowed_character(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let long = "z".repeat(200);
    let odd = "Az09-+/;.$_():@";
    for id in [long.as_str(), odd, "@start", "1a", "a1", "(x)", "007x"] {
        assert_eq!(c.put_id(0, 0, 60, b"x", id).await, format!("INSERTED {id}"));
        let job = c.reserve_body().await;
        assert_eq!(job.id, id);
        assert_eq!(c.stats_job(id).await.get("id"), format!("\"{id}\""));
        assert_eq!(c.cmd(&format!("delete {id}")).await, "DELETED");
    }
}

async fn every_id_command_takes_a_client_id(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let id = OID;
    assert_eq!(
        c.put_id(7, 0, 60, b"body", id).await,
        format!("INSERTED {id}")
    );
    let job = c.found(&format!("peek {id}")).await;
    assert_eq!((job.id.as_str(), &job.body[..]), (id, &b"body"[..]));
    let s = c.stats_job(id).await;
    assert_eq!(s.get("id"), "\"order-close:4711\"");
    assert_eq!(s.map()["tube"], "default");
    assert_eq!(c.found("peek-ready").await.id, id);
    let job = c.reserved(&format!("reserve-job {id}")).await;
    assert_eq!(job.id, id);
    assert_eq!(c.cmd(&format!("touch {id}")).await, "TOUCHED");
    assert_eq!(c.cmd(&format!("release {id} 3 100")).await, "RELEASED");
    assert_eq!(c.found("peek-delayed").await.id, id);
    assert_eq!(c.cmd(&format!("kick-job {id}")).await, "KICKED");
    assert_eq!(c.reserve_body().await.id, id);
    assert_eq!(c.cmd(&format!("bury {id} 2")).await, "BURIED");
    assert_eq!(c.found("peek-buried").await.id, id);
    assert_eq!(c.cmd("kick 1").await, "KICKED 1");
    let s = c.stats_job(id).await;
    let got = (
        s.num("pri"),
        s.num("releases"),
        s.num("buries"),
        s.num("kicks"),
    );
    assert_eq!(got, (2, 1, 1, 2));
    assert_eq!(s.num("reserves"), 2);
    assert_eq!(c.reserve_body().await.id, id);
    assert_eq!(c.cmd(&format!("finish {id}")).await, "FINISHED");
    assert_eq!(
        c.put_id(7, 0, 60, b"body", id).await,
        format!("INSERTED {id}")
    );
    assert_eq!(c.cmd(&format!("delete {id}")).await, "DELETED");
    for cmd in [
        "peek",
        "stats-job",
        "delete",
        "kick-job",
        "touch",
        "reserve-job",
        "finish",
    ] {
        assert_eq!(c.cmd(&format!("{cmd} {id}")).await, "NOT_FOUND", "{cmd}");
    }
    assert_eq!(c.cmd(&format!("release {id} 0 0")).await, "NOT_FOUND");
    assert_eq!(c.cmd(&format!("bury {id} 0")).await, "NOT_FOUND");
}

async fn digit_ids_never_name_client_id_jobs(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    let named = c.put_id(0, 0, 60, b"named", "n:1").await;
    assert_eq!(named, "INSERTED n:1");
    let n = c.put_ok(0, 0, 60, b"numbered").await;
    // However server ids are counted, no number reaches the named job.
    for id in 0..=n + 1 {
        match c.cmd(&format!("peek {id}")).await.as_str() {
            "NOT_FOUND" => {}
            line => {
                let job = c.job_after("FOUND", line).await;
                assert_eq!((job.id, job.body), (id.to_string(), b"numbered".to_vec()));
            }
        }
    }
}

async fn unknown_client_id_is_not_found(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut c = server.client().await;
    // beanstalkd says BAD_FORMAT; for delayq `abc` is a valid client id.
    for cmd in [
        "delete abc",
        "delete +1",
        "peek abc",
        "touch abc",
        "kick-job abc",
        "stats-job abc",
        "reserve-job abc",
        "finish abc",
        "release abc 0 0",
        "bury abc 0",
    ] {
        assert_eq!(c.cmd(cmd).await, "NOT_FOUND", "{cmd}");
    }
    for cmd in ["delete a#c", "peek -abc", "touch a.b!", "stats-job a*"] {
        assert_eq!(c.cmd(cmd).await, "BAD_FORMAT", "{cmd}");
    }
}

async fn finish_only_for_a_job_reserved_here(backend: Backend) {
    let server = TestServer::start(backend).await;
    let mut a = server.client().await;
    let mut b = server.client().await;
    a.put_id(0, 0, 60, b"named", "job:a").await;
    let n = a.put_ok(0, 0, 60, b"numbered").await;
    assert_eq!(a.cmd("finish job:a").await, "NOT_FOUND", "ready");
    assert_eq!(b.reserve_body().await.id, "job:a");
    assert_eq!(
        a.cmd("finish job:a").await,
        "NOT_FOUND",
        "reserved elsewhere"
    );
    assert_eq!(b.cmd("finish job:a").await, "FINISHED");
    assert_eq!(b.cmd("finish job:a").await, "NOT_FOUND", "gone");
    assert_eq!(b.cmd("peek job:a").await, "NOT_FOUND");
    assert_eq!(b.reserve_body().await.id, n.to_string());
    b.cmd(&format!("bury {n} 0")).await;
    assert_eq!(b.cmd(&format!("finish {n}")).await, "NOT_FOUND", "buried");
    b.cmd(&format!("kick-job {n}")).await;
    b.reserve_body().await;
    assert_eq!(b.cmd(&format!("finish {n}")).await, "FINISHED");
    assert_eq!(b.cmd("finish 999").await, "NOT_FOUND");
    let s = a.stats().await;
    assert_eq!(s.num("cmd-finish"), 7);
    // A finish removes the job like a delete does, for the tube's count.
    assert_eq!(a.stats_tube("default").await.num("cmd-delete"), 2);
    assert_eq!(
        s.num("current-jobs-reserved") + s.num("current-jobs-ready"),
        0
    );
    assert_eq!(s.num("current-jobs-buried"), 0);
}
