//! Redis over TLS with a private CA and a client certificate, against a
//! real `redis-server --tls-port` with certificates made by `openssl` for
//! this test. Settings given as flags and as environment variables.

mod common;

use common::servers::{ClusterTls, Redis, RedisCluster};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl").current_dir(dir).args(args).output().expect("openssl is installed");
    assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A CA, a server certificate for 127.0.0.1 and a client certificate,
/// both signed by the CA.
fn certificates(dir: &Path) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "2",
            "-subj",
            "/CN=cachewright test CA",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ],
    );
    std::fs::write(dir.join("server.ext"), "subjectAltName=IP:127.0.0.1,DNS:localhost\n").unwrap();
    std::fs::write(dir.join("client.ext"), "extendedKeyUsage=clientAuth\n").unwrap();
    for who in ["server", "client"] {
        let (key, csr, crt, ext) =
            (format!("{who}.key"), format!("{who}.csr"), format!("{who}.crt"), format!("{who}.ext"));
        openssl(
            dir,
            &["req", "-newkey", "rsa:2048", "-nodes", "-keyout", &key, "-out", &csr, "-subj", &format!("/CN={who}")],
        );
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "2",
                "-out",
                &crt,
                "-extfile",
                &ext,
            ],
        );
    }
}

fn cli(args: &[&str], env: &[(&str, String)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cachewright"));
    cmd.args(args).env_remove("CACHEWRIGHT_CONFIG");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run cachewright")
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

#[test]
fn rediss_with_a_private_ca_and_a_client_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let certs = |name: &str| -> PathBuf { dir.path().join(name) };
    certificates(dir.path());
    let redis = Redis::start_tls(&certs("server.crt"), &certs("server.key"), &certs("ca.crt"));
    let s = common::shared();
    let name = common::unique("tls");
    let base = vec![
        ("MONGODB_URI", s.mongo.uri()),
        ("MONGODB_DB", name.clone()),
        ("REDIS_URL", redis.url()),
        ("CACHEWRIGHT_PREFIX", format!("{name}:")),
        ("CACHEWRIGHT_STATUS_PREFIX", format!("cw-{name}:")),
    ];
    let cfg = common::TestEnv::named(&name).redis(&redis.url()).config();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(common::load_fixtures(&cfg, &common::fixture_dir("edge-cases")));
    let path = |p: PathBuf| p.display().to_string();

    // Flags: rebuild over TLS with the private CA and the client certificate.
    let flags = ["--redis-tls-ca", &path(certs("ca.crt")), "--redis-tls-cert", &path(certs("client.crt"))];
    let key = ["--redis-tls-key", &path(certs("client.key"))];
    let out = cli(&[&["rebuild"], &flags[..], &key[..]].concat(), &base);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));

    // Environment: verify reads it all back over TLS and finds it exact.
    let mut env = base.clone();
    env.push(("REDIS_TLS_CA", path(certs("ca.crt"))));
    env.push(("REDIS_TLS_CERT", path(certs("client.crt"))));
    env.push(("REDIS_TLS_KEY", path(certs("client.key"))));
    let out = cli(&["verify"], &env);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));

    // Without the private CA the server is not trusted.
    let out = cli(&[&["verify"], &key[..], &["--redis-tls-cert", &path(certs("client.crt"))][..]].concat(), &base);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("cannot connect to Redis"), "{}", text(&out));

    // Without a client certificate the server refuses us.
    let out = cli(&["verify", "--redis-tls-ca", &path(certs("ca.crt"))], &base);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));

    // A certificate without its key is a configuration error.
    let out = cli(&[&["verify"], &flags[..]].concat(), &base);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("REDIS_TLS_KEY"), "{}", text(&out));

    // A missing file says which setting points at it.
    let out = cli(&["verify", "--redis-tls-ca", "/nonexistent/ca.pem"], &base);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("REDIS_TLS_CA file /nonexistent/ca.pem"), "{}", text(&out));
}

#[test]
fn rediss_on_a_cluster_with_a_client_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let certs = |name: &str| -> PathBuf { dir.path().join(name) };
    certificates(dir.path());
    let tls = ClusterTls {
        cert: certs("server.crt"),
        key: certs("server.key"),
        ca: certs("ca.crt"),
        client_cert: certs("client.crt"),
        client_key: certs("client.key"),
    };
    // TLS only: clients and the cluster bus; the nodes announce their TLS
    // ports, which cachewright then reaches with the same certificates.
    let cluster = RedisCluster::start_tls(&tls);
    let s = common::shared();
    let name = common::unique("tlscluster");
    let cfg = common::TestEnv::named(&name).redis(&cluster.url()).config();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(common::generate(&cfg, 300, 5));
    let path = |p: PathBuf| p.display().to_string();
    let env = vec![
        ("MONGODB_URI", s.mongo.uri()),
        ("MONGODB_DB", name.clone()),
        ("REDIS_URL", cluster.url()),
        ("CACHEWRIGHT_PREFIX", format!("{name}:")),
        ("CACHEWRIGHT_STATUS_PREFIX", format!("cw-{name}:")),
        ("REDIS_TLS_CA", path(certs("ca.crt"))),
        ("REDIS_TLS_CERT", path(certs("client.crt"))),
        ("REDIS_TLS_KEY", path(certs("client.key"))),
    ];
    assert!(cluster.url().starts_with("rediss://"));

    let out = cli(&["rebuild"], &env);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = cli(&["verify"], &env);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));

    // The keys were written through every master, not one node.
    for node in &cluster.nodes {
        let args: Vec<String> =
            ["-p", &node.port.to_string(), "--scan", "--pattern", &format!("{name}:*")].map(String::from).to_vec();
        let out = cluster.cli(&args);
        let keys = String::from_utf8_lossy(&out.stdout).lines().count();
        assert!(keys > 0, "master {} holds none of the cache: {}", node.port, String::from_utf8_lossy(&out.stderr));
    }

    // Without the client certificate the masters refuse us.
    let without: Vec<(&str, String)> =
        env.iter().filter(|(k, _)| !matches!(*k, "REDIS_TLS_CERT" | "REDIS_TLS_KEY")).cloned().collect();
    let out = cli(&["verify"], &without);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("cannot connect to Redis"), "{}", text(&out));
}
